"""The one vectorized drawing core that every strategy shares.

A strategy describes an epoch as a :class:`ClassWeights` or a :class:`SampleWeights`; :func:`draw`
turns that into an index tensor. Nothing here loops over samples in Python, every probability or
cumulative table is float64 (float32 tables starve items at 10^7 samples), and nothing calls
``torch.multinomial`` (capped at 2^24 categories).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["ClassWeights", "SampleWeights", "LabelIndex", "draw", "epoch_generator", "as_labels"]


@dataclass(frozen=True)
class ClassWeights:
    """Draw class ``c`` with probability ``weights[c] / weights.sum()``, then a uniform member of it.

    ``weights`` is a float64 tensor of length ``num_classes``; empty classes must weigh zero.
    """

    weights: torch.Tensor


@dataclass(frozen=True)
class SampleWeights:
    """Draw sample ``i`` with probability ``weights[i] / weights.sum()`` (float64, length N)."""

    weights: torch.Tensor


Distribution = ClassWeights | SampleWeights


def as_labels(labels: Sequence[int] | torch.Tensor, num_classes: int | None = None) -> torch.Tensor:
    """Validate class labels and return them as a 1-D int64 CPU tensor."""
    if not isinstance(labels, torch.Tensor):
        try:
            labels = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"labels: could not convert to a tensor ({err}); pass a sequence of non-negative "
                "integers or a 1-D integer tensor"
            ) from None
    labels = labels.detach().cpu()
    if labels.dim() != 1:
        raise ValueError(f"labels: expected a 1-D sequence, got shape {tuple(labels.shape)}")
    if labels.numel() == 0:
        raise ValueError("labels: empty; a sampler needs at least one labelled sample")
    if labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(f"labels: expected integer class ids, got dtype {labels.dtype}")
    if labels.is_floating_point() and (
        not torch.isfinite(labels).all() or (labels != labels.round()).any()
    ):
        raise ValueError(
            "labels: non-integer values found; pass integer class ids 0..C-1 "
            "(e.g. labels.long() after checking they are whole numbers)"
        )
    labels = labels.long()
    smallest = int(labels.min())
    if smallest < 0:
        raise ValueError(f"labels: negative class id {smallest}; class ids must be 0..C-1")
    largest = int(labels.max())
    if num_classes is not None and largest >= num_classes:
        raise ValueError(
            f"num_classes={num_classes} but labels contain class {largest}; "
            f"raise num_classes to at least {largest + 1} or leave it None"
        )
    return labels


class LabelIndex:
    """Labels sorted by class: the members of class ``c`` are
    ``order[offsets[c] : offsets[c] + counts[c]]``, in dataset order."""

    def __init__(self, labels: torch.Tensor, num_classes: int | None = None) -> None:
        self.labels = labels
        self.num_classes = num_classes if num_classes is not None else int(labels.max()) + 1
        self.counts = torch.bincount(labels, minlength=self.num_classes)
        self.offsets = torch.cumsum(self.counts, 0) - self.counts
        self.order = torch.argsort(labels, stable=True)

    def __len__(self) -> int:
        return self.labels.numel()

    def member(self, classes: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Dataset index of the ``positions``-th member of each class in ``classes``."""
        return self.order[self.offsets[classes] + positions]

    def uniform_members(self, classes: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One uniformly chosen member of each class in ``classes`` (with replacement)."""
        counts = self.counts[classes]
        u = torch.rand(classes.numel(), dtype=torch.float64, generator=generator)
        # u < 1, but u * count can round up to count in float64: clamp to the last member.
        positions = torch.minimum((u * counts).long(), counts - 1)
        return self.member(classes, positions)


def epoch_generator(seed: int, epoch: int, stream: str = "draw") -> torch.Generator:
    """A CPU generator that is a pure function of (seed, epoch, stream), independent of the global RNG."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{stream}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))


def draw(
    distribution: Distribution,
    index: LabelIndex,
    num_samples: int,
    replacement: bool,
    generator: torch.Generator,
) -> torch.Tensor:
    """Draw ``num_samples`` dataset indices (int64) from ``distribution``.

    With replacement the cost is O(num_samples) for class weights and O(num_samples log N) for
    sample weights. Without replacement it is a weighted random order (Efraimidis-Spirakis
    exponential keys), which reduces to ``randperm`` when all samples weigh the same.
    """
    if isinstance(distribution, ClassWeights):
        if replacement:
            return _draw_classes(distribution.weights, index, num_samples, generator)
        sample_weights = (distribution.weights / index.counts.clamp(min=1))[index.labels]
    else:
        sample_weights = distribution.weights
    if replacement:
        return _draw_samples(sample_weights, num_samples, generator)
    return _weighted_order(sample_weights, num_samples, generator)


def _draw_classes(
    weights: torch.Tensor, index: LabelIndex, num_samples: int, generator: torch.Generator
) -> torch.Tensor:
    cumulative = torch.cumsum(weights, 0, dtype=torch.float64)
    u = torch.rand(num_samples, dtype=torch.float64, generator=generator) * cumulative[-1]
    # right=True: u lands in [cum[c-1], cum[c]), so a zero-weight class is never chosen.
    classes = torch.searchsorted(cumulative, u, right=True).clamp_(max=weights.numel() - 1)
    del u
    return index.uniform_members(classes, generator)


def _draw_samples(
    weights: torch.Tensor, num_samples: int, generator: torch.Generator
) -> torch.Tensor:
    cumulative = torch.cumsum(weights, 0, dtype=torch.float64)
    u = torch.rand(num_samples, dtype=torch.float64, generator=generator) * cumulative[-1]
    return torch.searchsorted(cumulative, u, right=True).clamp_(max=weights.numel() - 1)


def _weighted_order(
    weights: torch.Tensor, num_samples: int, generator: torch.Generator
) -> torch.Tensor:
    if bool((weights == weights[0]).all()):
        return torch.randperm(weights.numel(), generator=generator)[:num_samples]
    keys = torch.empty(weights.numel(), dtype=torch.float64).exponential_(generator=generator)
    keys /= weights  # zero weight -> infinite key -> never among the first num_samples
    if num_samples * 4 < weights.numel():
        return torch.topk(keys, num_samples, largest=False, sorted=True).indices
    return torch.argsort(keys)[:num_samples]
