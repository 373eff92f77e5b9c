"""The one vectorized drawing core that every strategy shares.

A strategy describes an epoch as a :class:`ClassWeights` or a :class:`SampleWeights`; :func:`draw`
turns that into an index tensor. Nothing here loops over samples in Python, every probability or
cumulative table is float64 (float32 tables starve items at 10^7 samples), and nothing calls
``torch.multinomial`` (capped at 2^24 categories).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

import torch

__all__ = [
    "AliasTable",
    "GuideTable",
    "ClassWeights",
    "SampleWeights",
    "LabelIndex",
    "as_labels",
    "check_bool",
    "check_int",
    "check_number",
    "cycled_passes",
    "draw",
    "epoch_seed",
    "generator_for",
    "group_by",
    "on_pool_thread",
    "run_tasks",
    "sub_seed",
]


#: Above this many items the table is a :class:`GuideTable`, for memory (see ``_Weights``).
ALIAS_MAX = 1 << 24


@dataclass(frozen=True)
class _Weights:
    weights: torch.Tensor
    #: Set by strategies whose weights are new every epoch (hard_mined): their table is built
    #: every epoch, so the cheaper build wins over the cheaper draw.
    changes_each_epoch: bool = False

    @cached_property
    def table(self) -> AliasTable | GuideTable:
        """Built on first use and kept: a strategy that returns the same object every epoch
        (fixed weights) builds its table once. An alias table draws fastest (no search at
        all); a guide table builds several times faster and in 12 bytes per item, where an
        alias table's build holds several temporaries as large as the weights (4 GB at 10^8)."""
        if self.changes_each_epoch or self.weights.numel() > ALIAS_MAX:
            return GuideTable(self.weights)
        return AliasTable(self.weights)


class ClassWeights(_Weights):
    """Draw class ``c`` with probability ``weights[c] / weights.sum()``, then a uniform member of it.

    ``weights`` is a float64 tensor of length ``num_classes``; empty classes must weigh zero.
    """


class SampleWeights(_Weights):
    """Draw sample ``i`` with probability ``weights[i] / weights.sum()`` (float64, length N)."""

    @classmethod
    def for_one_epoch(cls, weights: torch.Tensor) -> SampleWeights:
        """Weights that a strategy computes anew every epoch (its table is built each time)."""
        return cls(weights, changes_each_epoch=True)


Distribution = ClassWeights | SampleWeights


def check_int(name: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an int (>= ``minimum`` when given), or a ValueError that names ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or (minimum is not None and value < minimum)
    ):
        what = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a real bool, or a ValueError that names ``name``.

    Strings and numbers are refused rather than read as truthy: ``"False"`` from a config file or
    ``0`` would otherwise silently mean the opposite of what was meant.
    """
    if not isinstance(value, bool):
        raise ValueError(
            f"{name} must be True or False, got {value!r} ({type(value).__name__}); pass a bool "
            "(in YAML: true / false, unquoted)"
        )
    return value


def check_number(name: str, value: Any) -> float:
    """``value`` as a finite float, or a ValueError that names ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


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
        self.order = group_by(labels, self.num_classes)[0]
        self._counts_f64 = self.counts.double()

    def __len__(self) -> int:
        return self.labels.numel()

    def member(self, classes: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Dataset index of the ``positions``-th member of each class in ``classes``."""
        return torch.index_select(
            self.order, 0, torch.index_select(self.offsets, 0, classes) + positions
        )

    def uniform_members(self, classes: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One uniformly chosen member of each class in ``classes`` (with replacement)."""
        u = torch.rand(classes.numel(), dtype=torch.float64, generator=generator)
        # floor(u * n) < n for every float64 u < 1 and integer n < 2^53: the product's exact
        # value n - n*2^-53 (at most) lies closer to n - ulp than to n, so it never rounds up.
        positions = u.mul_(torch.index_select(self._counts_f64, 0, classes)).long()
        positions += torch.index_select(self.offsets, 0, classes)
        return torch.index_select(self.order, 0, positions)


_GOLDEN = 0x9E3779B97F4A7C15
_MASK63 = (1 << 63) - 1
#: Random work runs in chunks of this many items, each from its own generator, so the result
#: does not depend on how many threads produced it (and chunks stay in cache).
CHUNK = 1 << 16
_pool: ThreadPoolExecutor | None = None
_in_worker = threading.local()


def _forget_pool() -> None:
    """A forked child inherits the pool object but not its threads: start a fresh one there."""
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed that is a pure function of (seed, epoch), independent of the global RNG."""
    digest = hashlib.blake2b(f"{seed}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _MASK63


def sub_seed(seed: int, stream: int) -> int:
    """The 63-bit seed of one stream (a chunk, a class, a pass) of ``seed``."""
    return (seed + (stream + 1) * _GOLDEN) & _MASK63


def generator_for(seed: int, stream: int = 0) -> torch.Generator:
    """A fresh CPU generator for one stream (e.g. one chunk) of a 63-bit seed."""
    return torch.Generator().manual_seed(sub_seed(seed, stream))


def _start_worker(threads: int) -> None:
    """Pool threads run torch on one thread each: the pool's chunks are the parallelism, and a
    small draw never waits on intra-op threads that a loaded machine has descheduled (a draw of
    10^4 labels took 42 ms with two intra-op threads under load, 2 ms with one)."""
    torch.get_num_threads()  # torch's lazy per-thread setup first, so that it cannot undo this
    torch.set_num_threads(1)  # per thread under OpenMP, but it also sets torch's default for new
    # threads; a short-lived thread puts that default back, so user threads are unaffected.
    restore = threading.Thread(target=torch.set_num_threads, args=(threads,))
    restore.start()
    restore.join()
    _in_worker.active = True


def run_tasks(tasks: Sequence[Callable[[], object]]) -> None:
    """Run independent ``tasks`` (each seeded on its own) on the drawing pool.

    Inside a pool thread the tasks run inline: nested waits on one pool could deadlock.
    """
    global _pool
    if getattr(_in_worker, "active", False):
        for task in tasks:
            task()
        return
    if _pool is None:
        threads = torch.get_num_threads()
        _pool = ThreadPoolExecutor(
            max_workers=max(1, min(threads, 8)), initializer=_start_worker, initargs=(threads,)
        )
    for future in [_pool.submit(task) for task in tasks]:
        future.result()  # torch releases the GIL inside its kernels; errors surface here


def on_pool_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` computed on a pool thread, where torch runs single-threaded: sums and tables
    built there do not depend on the thread count (a parallel sum rounds differently)."""
    result: list[Any] = []
    run_tasks([lambda: result.append(fn())])
    return result[0]


def _chunks(count: int) -> range:
    return range(-(-count // CHUNK))


def _in_chunks(
    count: int, seed: int, produce: Callable[[int, torch.Generator], torch.Tensor]
) -> torch.Tensor:
    """``produce(size, generator)`` for each chunk of ``count``, on the drawing pool."""
    out = torch.empty(count, dtype=torch.long)

    def fill(chunk: int) -> None:
        start = chunk * CHUNK
        size = min(CHUNK, count - start)
        out[start : start + size] = produce(size, generator_for(seed, chunk))

    run_tasks([partial(fill, chunk) for chunk in _chunks(count)])
    return out


def group_by(keys: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices that sort integer ``keys`` in ``[0, num_groups)`` stably, and each group's size.

    A counting sort: each cache-sized chunk is sorted on its own in the narrowest integer dtype
    (torch sorts those far faster than int64 or a whole array) and placed by the counts of the
    chunks before it.
    """
    dtype = (
        torch.uint8 if num_groups <= 256 else torch.int16 if num_groups <= 2**15 else torch.int32
    )
    keys = keys.to(dtype)
    count = keys.numel()
    chunks = _chunks(count)
    per_chunk = torch.zeros(len(chunks), num_groups, dtype=torch.long)

    def tally(chunk: int) -> None:
        part = keys[chunk * CHUNK : (chunk + 1) * CHUNK]
        per_chunk[chunk] = torch.bincount(part.int(), minlength=num_groups)

    run_tasks([partial(tally, chunk) for chunk in chunks])
    totals = per_chunk.sum(0)
    # Where chunk j's members of group g start in the result, minus where they start in the
    # chunk's own sorted order: the shift from one to the other.
    shift = (torch.cumsum(totals, 0) - totals) + (torch.cumsum(per_chunk, 0) - per_chunk)
    shift -= torch.cumsum(per_chunk, 1) - per_chunk
    out = torch.empty(count, dtype=torch.long)

    def place(chunk: int) -> None:
        start = chunk * CHUNK
        part = keys[start : start + CHUNK]
        local = torch.argsort(part, stable=True)
        target = torch.index_select(shift[chunk], 0, torch.index_select(part, 0, local).long())
        target += torch.arange(part.numel())
        out.index_copy_(0, target, local.add_(start))

    run_tasks([partial(place, chunk) for chunk in chunks])
    return out, totals


#: Below this size a class's passes are shuffled together, by sorting random keys row by row;
#: above it one ``randperm`` per pass is cheaper than the sort.
_ROW_SORT_MAX = 1024


def cycled_passes(size: int, take: int, slots: int, seed: int) -> torch.Tensor:
    """Positions in ``[0, size)`` for ``slots`` slots of ``take`` each, shape (slots, take).

    The positions are read in fresh shuffled passes, one pass every ``ceil(size / take)``
    slots. When ``take`` does not divide ``size``, a pass's last slot is completed with the
    first positions of the same pass, so every position appears in every pass and, when
    ``take <= size``, no slot holds a position twice. With ``take > size`` each slot holds
    every position ``take // size`` or one more times.
    """
    per_pass = -(-size // take) * take  # positions a pass hands out, its own start repeated
    needed = slots * take
    passes = -(-needed // per_pass)
    reps = -(-per_pass // size)
    if passes > 1 and size <= _ROW_SORT_MAX:
        keys = torch.rand(passes, size, dtype=torch.float64, generator=generator_for(seed))
        perms = torch.argsort(keys, dim=1, stable=True)
        return perms.repeat(1, reps)[:, :per_pass].reshape(-1)[:needed].view(slots, take)
    if passes == 1 and reps == 1:  # part of one pass: no copy
        return torch.randperm(size, generator=generator_for(seed))[:needed].view(slots, take)
    stream = torch.empty(needed, dtype=torch.long)
    for p, start in enumerate(range(0, needed, per_pass)):
        part = stream[start : start + per_pass]
        perm = torch.randperm(size, generator=generator_for(seed, p))
        if reps > 1:
            perm = perm.repeat(reps)
        part.copy_(perm[: part.numel()])
    return stream.view(slots, take)


class AliasTable:
    """Walker's alias table over K items: O(1) per draw, exact up to float64 rounding.

    Built without a Python loop over items: with weights scaled to mean 1, light items (< 1) and
    heavy items are swept in index order, so each light bucket's deficit comes from the heavy
    item whose cumulative excess covers it, and each heavy item, once its residual drops below
    1, takes the rest of its bucket from the next heavy item. Both assignments are one
    ``searchsorted`` over the cumulative deficits and excesses.
    """

    def __init__(self, weights: torch.Tensor) -> None:
        k = weights.numel()
        scaled = weights.double() * (k / weights.sum(dtype=torch.float64))
        self.keep = torch.ones(k, dtype=torch.float64)
        self.alias = torch.arange(k)
        light = torch.nonzero(scaled < 1.0).flatten()
        heavy = torch.nonzero(scaled >= 1.0).flatten()
        if light.numel() and heavy.numel():
            light_scaled = torch.index_select(scaled, 0, light)
            deficit = torch.cumsum(1.0 - light_scaled, 0)
            excess = torch.cumsum(torch.index_select(scaled, 0, heavy) - 1.0, 0)
            last = heavy.numel() - 1
            # Light i is filled by the first heavy j whose cumulative excess reaches D_{i-1}.
            donor = torch.searchsorted(excess, deficit - (1.0 - light_scaled)).clamp_(max=last)
            self.keep.index_copy_(0, light, light_scaled)
            self.alias.index_copy_(0, light, torch.index_select(heavy, 0, donor))
            # Heavy j turns light at the first light with D_i > E_j; it keeps 1 + E_j - D_i and
            # takes the rest of its bucket from heavy j + 1. The last heavy keeps a whole bucket.
            turn = torch.searchsorted(deficit[:-1], excess[:-1], right=True)
            residual = 1.0 + excess[:-1] - torch.index_select(deficit, 0, turn)
            self.keep.index_copy_(0, heavy[:-1], residual.clamp_(0.0, 1.0))
            self.alias.index_copy_(0, heavy[:-1], heavy[1:])

    def sample(self, count: int, generator: torch.Generator) -> torch.Tensor:
        bucket = torch.randint(0, self.keep.numel(), (count,), generator=generator)
        u = torch.rand(count, dtype=torch.float64, generator=generator)
        stays = u < torch.index_select(self.keep, 0, bucket)
        return torch.where(stays, bucket, torch.index_select(self.alias, 0, bucket))


class GuideTable:
    """Inverse-CDF lookup over K items with a guide table (Chen & Asau 1974): built in O(K),
    about one lookup per draw, exact up to float64 rounding.

    The cumulative weights are scaled to ``[0, B)`` with ``B >= K`` buckets; ``guide[j]`` is the
    item that covers point ``j``. A draw ``u`` starts at ``guide[floor(u)]`` and steps forward
    past the item ends at or below ``u``; a bucket holds at most one item end on average, so two
    steps settle nearly every draw and the rare rest is a binary search. The build is a cumulative
    sum and a bincount, several times cheaper than an alias table's, so weights that change
    every epoch (hard_mined) use it.
    """

    def __init__(self, weights: torch.Tensor) -> None:
        k = weights.numel()
        buckets = max(k, 1 << 12)  # few classes: more buckets, so that no steps are needed
        self.ends = torch.cumsum(weights.double(), 0)
        self.ends *= buckets / float(self.ends[-1])
        self.total = float(self.ends[-1])
        self.last = k - 1
        # Items per bucket: with many buckets per item a draw almost never has to step.
        self.steps = 0 if buckets >= 16 * k else 2
        # guide[j] = number of items that end at or before j = the item covering j; zero-weight
        # items end where their predecessor does and are stepped over. Counted chunk by chunk,
        # so that no temporary as large as the weights is made (10^8 samples: 800 MB each).
        dtype = torch.int32 if k < 2**31 else torch.long
        self.guide = torch.zeros(buckets + 2, dtype=dtype)
        one = torch.ones(1, dtype=dtype).expand(CHUNK)
        for start in range(0, k, CHUNK):
            ends_at = torch.ceil(self.ends[start : start + CHUNK]).long().clamp_(max=buckets + 1)
            self.guide.index_add_(0, ends_at, one[: ends_at.numel()])
        self.guide = torch.cumsum(self.guide[: buckets + 1], 0, dtype=dtype)

    def lookup(self, u: torch.Tensor) -> torch.Tensor:
        """The item covering each point ``u`` of ``[0, total)`` (float64)."""
        item = torch.index_select(self.guide, 0, u.long()).long()
        for _ in range(self.steps):
            item += torch.index_select(self.ends, 0, item.clamp_(max=self.last)) <= u
        item.clamp_(max=self.last)
        behind = torch.nonzero(torch.index_select(self.ends, 0, item) <= u).flatten()
        if behind.numel():
            found = torch.searchsorted(self.ends, torch.index_select(u, 0, behind), right=True)
            item.index_copy_(0, behind, found.clamp_(max=self.last))
        return item

    def sample(self, count: int, generator: torch.Generator) -> torch.Tensor:
        u = torch.rand(count, dtype=torch.float64, generator=generator).mul_(self.total)
        return self.lookup(u)


def draw(
    distribution: Distribution,
    index: LabelIndex,
    num_samples: int,
    replacement: bool,
    seed: int,
) -> torch.Tensor:
    """Draw ``num_samples`` dataset indices (int64) from ``distribution``, determined by ``seed``.

    With replacement: an :class:`AliasTable` (or, for weights new every epoch, a
    :class:`GuideTable`) over classes (then a uniform member of the class) or over samples;
    O(num_samples) after the table, built once for fixed weights. Without
    replacement: a weighted random order (Efraimidis-Spirakis exponential keys), ``randperm``
    when all samples weigh the same.
    """
    if replacement:
        table = distribution.table
        if isinstance(distribution, SampleWeights):
            return _in_chunks(num_samples, seed, table.sample)
        return _in_chunks(
            num_samples, seed, lambda n, g: index.uniform_members(table.sample(n, g), g)
        )
    return on_pool_thread(lambda: _weighted_order(distribution, index, num_samples, seed))


def _weighted_order(
    distribution: Distribution, index: LabelIndex, num_samples: int, seed: int
) -> torch.Tensor:
    weights = distribution.weights
    if isinstance(distribution, ClassWeights):
        per_member = weights / index.counts.clamp(min=1)
        present = per_member[index.counts > 0]
        if bool((present == present[0]).all()):  # every sample weighs the same: skip N weights
            return torch.randperm(len(index), generator=generator_for(seed))[:num_samples]
        weights = per_member[index.labels]  # spread each class's weight over its members
    if bool((weights == weights[0]).all()):
        return torch.randperm(weights.numel(), generator=generator_for(seed))[:num_samples]
    keys = torch.empty(weights.numel(), dtype=torch.float64).exponential_(
        generator=generator_for(seed)
    )
    keys /= weights  # zero weight -> infinite key -> never among the first num_samples
    if num_samples * 4 < weights.numel():
        return torch.topk(keys, num_samples, largest=False, sorted=True).indices
    return torch.argsort(keys)[:num_samples]
