"""Multi-label strategies: every sample carries any number of classes (an (N, C) 0/1 matrix).

Each strategy is a per-sample distribution on the shared drawing core, so exact ``len``, seeds,
sharding, mid-epoch resume and ``state_dict`` are the core's (see :class:`~samplers.Sampler`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from samplers._checks import check_number
from samplers._distributions import Distribution, SampleWeights
from samplers._multilabel_labels import as_label_matrix
from samplers.base import Sampler
from samplers.strategies import _check_weights

__all__ = [
    "AGGREGATES",
    "MultiLabelSampler",
    "MultiLabelInstanceSampler",
    "MultiLabelClassAwareSampler",
    "MultiLabelWeightedSampler",
    "rebalance_weights",
]

#: How :class:`MultiLabelWeightedSampler` folds a sample's per-label weights into one.
AGGREGATES = ("mean", "max", "sum")

LabelMatrix = Sequence[Sequence[int]] | torch.Tensor


class MultiLabelSampler(Sampler):
    """Base of the multi-label strategies: validates the label matrix, draws per sample.

    ``labels`` is an (N, C) 0/1 matrix (bool, integer or float tensor, list of rows, numpy
    array). ``labels``, ``num_classes`` and ``class_counts`` (positives per class) describe
    the matrix; :meth:`target_class_shares` is the share of each label among the labels of the
    drawn samples that the strategy intends (a drawn sample counts once for each of its labels).
    A subclass gives its per-sample weights to :meth:`_set_weights` in its ``__init__``, or
    overrides :meth:`distribution` (returning ``SampleWeights``).

    The core indexes one class id per sample; a multi-label strategy draws per-sample weights
    only, which never read class membership, so the core is given one pseudo-class that holds
    every sample (it learns the dataset size from it).
    """

    def __init__(
        self,
        labels: LabelMatrix,
        *,
        num_classes: int | None = None,
        replacement: bool = True,
        **kwargs: Any,
    ) -> None:
        matrix = as_label_matrix(labels, num_classes)
        pseudo_classes = torch.zeros(matrix.shape[0], dtype=torch.long)
        super().__init__(pseudo_classes, replacement=replacement, **kwargs)
        self.label_matrix = matrix
        self._columns = matrix.t().contiguous()  # one class's samples per row, read per class
        self._positives = matrix.sum(0)
        self._distribution: SampleWeights | None = None

    @property
    def labels(self) -> torch.Tensor:
        """The (N, C) bool label matrix."""
        return self.label_matrix

    @property
    def num_classes(self) -> int:
        return int(self.label_matrix.shape[1])

    @property
    def class_counts(self) -> torch.Tensor:
        """Samples that carry each class (int64, length C)."""
        return self._positives

    def _set_weights(self, weights: torch.Tensor) -> None:
        """Fix the per-sample weights; refuse a draw without replacement they cannot fill."""
        positive = int((weights > 0).sum())
        if positive == 0:
            raise ValueError(
                "labels: no row has a positive label, so every sample weighs zero; check the "
                "label matrix (one row per sample, a 1 for each class it carries)"
            )
        if not self.replacement and self.num_samples > positive:
            raise ValueError(
                f"num_samples={self.num_samples} exceeds the {positive} samples with positive "
                "weight; without replacement set replacement=True or lower num_samples"
            )
        self._distribution = SampleWeights(weights)

    def distribution(self, epoch: int) -> Distribution:
        if self._distribution is None:
            raise NotImplementedError(
                f"{type(self).__name__} has no weights: give them to _set_weights in its "
                "__init__, or override distribution"
            )
        return self._distribution

    def item_probabilities(self) -> torch.Tensor:
        """Probability of each sample per draw with replacement (float64, sums to 1)."""
        weights = self._current_distribution().weights
        return weights / weights.sum()

    def target_class_shares(self) -> torch.Tensor:
        """Intended share of each class among the labels of drawn samples (float64, sums to 1):
        ``sum_i p_i y_ic`` normalised, ``p`` the per-draw probabilities."""
        p = self.item_probabilities()
        per_label = torch.stack([p[column].sum() for column in self._columns])
        return per_label / per_label.sum()


class MultiLabelInstanceSampler(MultiLabelSampler):
    """Instance-balanced: every sample equally likely, whatever its labels.

    Without replacement (the default) an epoch is a shuffle, every sample once, in exactly
    :class:`~samplers.UniformSampler`'s order for the same seed and dataset size. Rows without
    a positive label are drawn like any other.

    Example:
        >>> from samplers import MultiLabelInstanceSampler
        >>> sampler = MultiLabelInstanceSampler([[1, 0], [1, 1], [0, 0]], seed=0)
        >>> sorted(sampler)
        [0, 1, 2]
    """

    def __init__(self, labels: LabelMatrix, *, replacement: bool = False, **kwargs: Any) -> None:
        super().__init__(labels, replacement=replacement, **kwargs)
        self._set_weights(torch.ones(self.label_matrix.shape[0], dtype=torch.float64))


def _fold(columns: torch.Tensor, per_class: torch.Tensor, aggregate: str) -> torch.Tensor:
    """Each sample's ``sum``, ``mean`` or ``max`` of ``per_class`` over its labels (0 without
    labels), from ``columns`` (C, N). One class at a time: each sample's terms meet in class
    order, so the floats and the draws cannot depend on how a matrix product would split its
    sums over threads."""
    out = torch.zeros(columns.shape[1], dtype=torch.float64)
    for column, weight in zip(columns, per_class.tolist(), strict=True):
        if aggregate == "max":
            torch.where(column, torch.clamp(out, min=weight), out, out=out)
        else:
            out.add_(column, alpha=weight)
    if aggregate == "mean":
        out /= columns.sum(0).clamp(min=1)
    return out


def _class_choice(
    counts: torch.Tensor, class_probabilities: Sequence[float] | torch.Tensor | None
) -> torch.Tensor:
    """The class distribution of class-aware sampling's first step: uniform over the classes
    with samples, or the given one (normalised), which must give empty classes no share."""
    present = counts > 0
    if class_probabilities is None:
        return present.double() / max(int(present.sum()), 1)
    choice = _check_weights("class_probabilities", class_probabilities, counts.numel(), "class")
    empty = torch.nonzero((choice > 0) & ~present).flatten().tolist()
    if empty:
        raise ValueError(
            f"class_probabilities: classes {empty} have no positive sample but a positive "
            "probability; set their probability to 0"
        )
    return choice


def _per_class_terms(counts: torch.Tensor, class_probabilities: torch.Tensor) -> torch.Tensor:
    """``pi_c / n_c`` for classes with samples, 0 for the others (float64)."""
    counts = counts.double()
    present = counts > 0
    return torch.where(present, class_probabilities / torch.where(present, counts, 1.0), 0.0)


class MultiLabelClassAwareSampler(MultiLabelSampler):
    r"""Class-aware sampling (Shen et al. 2016, as used by Wu et al. 2020,
    "Distribution-Balanced Loss for Multi-Label Classification in Long-Tailed Datasets").

    Each draw picks a class ``c`` (uniformly among the classes that have a positive sample, or
    from ``class_probabilities``), then a sample that carries ``c``, uniformly. A sample is
    drawn with probability :math:`p_i = \sum_{c \in y_i} \pi_c / n_c`, which is what is drawn
    here directly, per sample, with replacement; drawing a tail class brings its co-labels
    along, so :meth:`target_class_shares` (labels among drawn samples) is not uniform even
    though :meth:`class_choice_shares` is.

    Rows without a positive label are never drawn. A class without a positive sample gets no
    share of the uniform choice; a positive ``class_probabilities`` entry for it is refused.

    The reference code (``ClassAwareSampler`` of wutong16/DistributionBalancedLoss) draws the
    classes in shuffled cycles (every class once per ``C`` class picks, ``3 * C`` draws with
    ``num_samples_cls=3``) and reads each class's members
    in shuffled cycles, ``num_samples_cls=3`` at a time; here every draw is independent. The
    long-run share of every sample is the same ``p_i``; the reference's shares fluctuate less
    within an epoch. Its epoch is ``int(max(n_c) * C / reduce)`` draws (``reduce=4`` by
    default): pass that as ``num_samples`` to match it (default here: the dataset size).

    Example:
        >>> import torch
        >>> from samplers import MultiLabelClassAwareSampler
        >>> y = torch.tensor([[1, 0, 0], [1, 0, 0], [1, 1, 0], [0, 0, 1]])
        >>> sampler = MultiLabelClassAwareSampler(y, num_samples=8, seed=0)
        >>> sampler.item_probabilities().tolist()  # (1/3)(1/3), (1/3)(1/3), (1/3)(1/3 + 1), 1/3
        [0.1111111111111111, 0.1111111111111111, 0.4444444444444444, 0.3333333333333333]
        >>> len(list(sampler))
        8
    """

    def __init__(
        self,
        labels: LabelMatrix,
        *,
        class_probabilities: Sequence[float] | torch.Tensor | None = None,
        replacement: bool = True,
        **kwargs: Any,
    ) -> None:
        if replacement is not True:
            raise ValueError(
                f"replacement={replacement!r}: class-aware sampling draws with replacement (a "
                "class, then one of its samples); leave replacement=True, or use "
                "MultiLabelWeightedSampler(replacement=False) for a weighted order"
            )
        super().__init__(labels, replacement=True, **kwargs)
        self._choice = _class_choice(self.class_counts, class_probabilities)
        self._per_class = _per_class_terms(self.class_counts, self._choice)
        self._set_weights(_fold(self._columns, self._per_class, "sum"))

    def class_choice_shares(self) -> torch.Tensor:
        """The distribution of the class picked first in each draw (float64, sums to 1)."""
        return self._choice.clone()

    def rebalance_weights(self, indices: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The distribution-balanced loss's re-balancing weights of the samples ``indices``
        under this sampler's class choice: see :func:`rebalance_weights`."""
        rows = self.label_matrix[torch.as_tensor(indices, dtype=torch.long)]
        return _rebalance(rows, self._per_class)


def rebalance_weights(
    labels: LabelMatrix,
    class_counts: Sequence[int] | torch.Tensor,
    class_probabilities: Sequence[float] | torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Re-balancing weights of the distribution-balanced loss (Wu et al. 2020), before its
    smoothing map: :math:`r_{ic} = P^C_c(i) / P^I(i)`, float64, shape (B, C).

    :math:`P^C_c(i) = \pi_c / n_c` is the probability of drawing sample ``i`` through class
    ``c`` under class-aware sampling, :math:`P^I(i) = \sum_{c' \in y_i} \pi_{c'} / n_{c'}` its
    probability of being drawn at all; ``pi`` is uniform over the classes with samples unless
    ``class_probabilities`` is given. As in the reference ``rebalance_weight`` (which divides
    ``1 / class_freq`` by its sum over the sample's labels), every column gets a value, the
    negatives' too. Differences from the reference: a class with ``n_c = 0`` gets 0 (the
    reference divides by zero); a row without a positive label is refused (its ``P^I`` is 0).
    The loss then maps ``r`` through ``alpha + sigmoid(beta * (r - mu))``.

    Example:
        >>> from samplers import rebalance_weights
        >>> rebalance_weights([[1, 1, 0]], class_counts=[4, 1, 2]).tolist()
        [[0.2, 0.8, 0.4]]
    """
    rows = as_label_matrix(labels)
    counts = torch.as_tensor(class_counts, dtype=torch.float64).reshape(-1)
    if counts.numel() != rows.shape[1] or not bool(
        torch.isfinite(counts).all() & (counts >= 0).all()
    ):
        raise ValueError(
            f"class_counts: expected {rows.shape[1]} non-negative counts (one per label "
            f"column), got {counts.tolist()}; pass label_matrix.sum(0) of the training set"
        )
    return _rebalance(rows, _per_class_terms(counts, _class_choice(counts, class_probabilities)))


def _rebalance(rows: torch.Tensor, per_class: torch.Tensor) -> torch.Tensor:
    drawn = rows.double() @ per_class  # P^I of each row
    if (drawn <= 0).any():
        row = int(torch.nonzero(drawn <= 0)[0])
        raise ValueError(
            f"labels: row {row} has no positive label of a class with samples, so class-aware "
            "sampling never draws it and its re-balancing weight is undefined; leave such rows "
            "out of the weighted loss"
        )
    return per_class[None, :] / drawn[:, None]


class MultiLabelWeightedSampler(MultiLabelSampler):
    """Per-sample weights from the frequencies of the sample's labels.

    Each class ``c`` weighs ``n_c ** (q - 1)`` and a sample weighs the ``aggregate`` (``mean``,
    ``max`` or ``sum``) of its labels' weights. ``q`` means what it means for
    :class:`~samplers.WeightedSampler`: on one-hot labels the class shares are ``∝ n_c ** q``
    (1 instance-balanced, 0.5 square-root, 0 class-balanced). ``q=0`` with ``mean`` weighs a
    sample by the mean of ``1 / n_c`` over its labels, with ``max`` by its rarest label's
    ``1 / n_c``; ``q=0`` with ``sum`` is exactly :class:`MultiLabelClassAwareSampler`'s
    distribution. Rows without a positive label weigh 0 and are never drawn.

    Example:
        >>> from samplers import MultiLabelWeightedSampler
        >>> y = [[1, 0], [1, 0], [1, 0], [1, 1]]  # class 0 in 4 samples, class 1 in 1
        >>> sampler = MultiLabelWeightedSampler(y, q=0.0, aggregate="max", seed=0)
        >>> sampler.item_probabilities().tolist()  # 1/4, 1/4, 1/4, max(1/4, 1) normalised
        [0.14285714285714285, 0.14285714285714285, 0.14285714285714285, 0.5714285714285714]
    """

    def __init__(
        self,
        labels: LabelMatrix,
        *,
        q: float = 0.0,
        aggregate: str = "mean",
        replacement: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(labels, replacement=replacement, **kwargs)
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate={aggregate!r} is unknown; choose one of {AGGREGATES}")
        self.q = check_number("q", q)
        self.aggregate = aggregate
        counts = self.class_counts.double()
        per_class = torch.where(counts > 0, counts.clamp(min=1) ** (self.q - 1.0), 0.0)
        self._set_weights(_fold(self._columns, per_class, aggregate))
