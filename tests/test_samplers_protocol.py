"""The protocol every strategy inherits, checked as properties over random labels."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from tests.helpers.strategies import BATCH_SAMPLERS, STRATEGIES, WITHOUT_REPLACEMENT, feed_losses

pytestmark = pytest.mark.unit  # in one process, seconds

NAMES = sorted(STRATEGIES)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def label_sets(draw: st.DrawFn) -> list[int]:
    """Labels over 2-6 classes with 2+ samples each (fixed_class draws 2 distinct classes)."""
    num_classes = draw(st.integers(2, 6))
    counts = draw(st.lists(st.integers(2, 40), min_size=num_classes, max_size=num_classes))
    labels = [c for c, n in enumerate(counts) for _ in range(n)]
    order = draw(st.permutations(range(len(labels))))
    return [labels[i] for i in order]


def flat(sampler) -> list[int]:
    items = list(sampler)
    return [i for batch in items for i in batch] if sampler.batch_size else items


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(
    labels=label_sets(),
    seed=st.integers(0, 2**31),
    world_size=st.integers(1, 3),
    drop_last=st.booleans(),
    epoch=st.integers(0, 5),
    data=st.data(),
)
def test_len_is_exact_and_ranks_partition_the_global_draw(
    name, labels, seed, world_size, drop_last, epoch, data
):
    kwargs = {}
    if name not in BATCH_SAMPLERS:
        most = len(labels) if name in WITHOUT_REPLACEMENT else 3 * len(labels)
        kwargs["num_samples"] = data.draw(st.integers(1, most))
    ranks = [
        STRATEGIES[name](
            labels, seed=seed, rank=r, world_size=world_size, drop_last=drop_last, **kwargs
        )
        for r in range(world_size)
    ]
    single = STRATEGIES[name](labels, seed=seed, **kwargs)
    for s in [*ranks, single]:
        s.set_epoch(epoch)
    per_rank = [list(s) for s in ranks]
    for s, items in zip(ranks, per_rank, strict=True):
        assert len(items) == len(s)
        assert s.epoch_indices().shape[0] == len(s)
    assert len({len(items) for items in per_rank}) == 1
    # Every rank computes the same global draw, and it does not depend on world_size.
    global_draw = single.global_indices()
    for s in ranks:
        assert torch.equal(s.global_indices(), global_draw)
    # Interleaving the ranks gives back the global draw (padded by its start, or cut).
    interleaved = [per_rank[r][i] for i in range(len(per_rank[0])) for r in range(world_size)]
    expected = global_draw.tolist()
    while len(expected) < len(interleaved):
        expected += global_draw.tolist()
    assert interleaved == expected[: len(interleaved)]
    if not drop_last:
        assert len(interleaved) >= global_draw.shape[0]


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(labels=label_sets(), seed=st.integers(0, 2**31), cut=st.floats(0, 1))
def test_restored_mid_epoch_yields_exactly_the_rest(name, labels, seed, cut):
    sampler = STRATEGIES[name](labels, seed=seed)
    sampler.set_epoch(1)
    feed_losses(sampler)
    sampler.set_epoch(2)
    full = list(sampler)
    k = int(cut * len(full))
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(k)]
    state = sampler.state_dict()
    feed_losses(sampler)  # feedback arriving mid-epoch must not change the epoch's order
    restored = STRATEGIES[name](labels, seed=seed)
    restored.load_state_dict(state)
    assert head + list(restored) == full


@pytest.mark.parametrize("name", NAMES)
def test_order_is_a_function_of_seed_and_epoch(name):
    labels = [0] * 30 + [1] * 20 + [2] * 10
    torch.manual_seed(1)
    a = STRATEGIES[name](labels, seed=7)
    torch.manual_seed(2)  # the global RNG must not matter
    b = STRATEGIES[name](labels, seed=7)
    for epoch in (0, 3):
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        assert list(a) == list(b)
    a.set_epoch(0)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    assert flat(STRATEGIES[name](labels, seed=8)) != flat(STRATEGIES[name](labels, seed=7))


@pytest.mark.parametrize("name", NAMES)
def test_dataloader_workers_do_not_change_the_order(name):
    labels = [0] * 40 + [1] * 15 + [2] * 5
    dataset = torch.arange(len(labels))

    def order(workers: int) -> list[int]:
        sampler = STRATEGIES[name](labels, seed=3)
        sampler.set_epoch(2)
        key = "batch_sampler" if sampler.batch_size else "sampler"
        extra = {} if sampler.batch_size else {"batch_size": 8}
        loader = DataLoader(
            dataset,
            **{key: sampler},
            num_workers=workers,
            **extra,
            multiprocessing_context="fork" if workers else None,
        )
        return torch.cat(list(loader)).tolist()

    assert order(2) == order(0)


def test_feedback_free_samplers_ignore_update_but_validate_it():
    sampler = STRATEGIES["uniform"]([0, 0, 1, 1])
    before = list(sampler)
    sampler.update([0, 1], [0.5, 2.0])
    assert list(sampler) == before
    with pytest.raises(ValueError, match="2 indices but 3 losses"):
        sampler.update([0, 1], [0.5, 2.0, 1.0])
    with pytest.raises(ValueError, match="NaN or infinite"):
        sampler.update([0, 1], [0.5, float("nan")])
    with pytest.raises(ValueError, match="indices must lie"):
        sampler.update([0, 9], [0.5, 1.0])
