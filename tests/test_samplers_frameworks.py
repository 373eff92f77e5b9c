"""What the samplers show to training frameworks, checked without any framework (the frameworks
themselves run in tests/test_frameworks.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from samplers import FixedClassSampler, HardMinedSampler, MixtureSampler, Sampler, UniformSampler
from samplers.integrations import find_sampler, gather_across_ranks, update_across_ranks

pytestmark = pytest.mark.unit  # in one process, seconds

LABELS = [0] * 30 + [1] * 12 + [2] * 6


def fixed_class(**kwargs):
    return FixedClassSampler(LABELS, classes_per_batch=2, samples_per_class=3, seed=1, **kwargs)


def test_samplers_are_distributed_samplers_and_batch_samplers_batch_samplers():
    index, batches = UniformSampler(LABELS), fixed_class()
    assert isinstance(index, DistributedSampler) and not isinstance(index, BatchSampler)
    assert isinstance(batches, BatchSampler) and isinstance(batches, DistributedSampler)
    assert (index.num_replicas, index.rank) == (1, 0)
    assert batches.sampler is batches  # frameworks call batch_sampler.sampler.set_epoch
    batches.sampler.set_epoch(3)
    assert batches.epoch == 3
    with pytest.raises(AttributeError, match="cannot be replaced"):
        batches.sampler = UniformSampler(LABELS)


def test_a_frameworks_distributed_sampler_sets_rank_and_world_size():
    """What Lightning passes when it rebuilds a batch sampler from its arguments."""
    handed = DistributedSampler(range(len(LABELS)), num_replicas=2, rank=1, shuffle=True)
    rebuilt = fixed_class(sampler=handed)
    assert (rebuilt.rank, rebuilt.world_size) == (1, 2)
    own = fixed_class(rank=1, world_size=2)
    assert torch.equal(rebuilt.epoch_indices(), own.epoch_indices())
    assert [list(b) for b in rebuilt] == own.epoch_indices().tolist()
    mixture = MixtureSampler(
        LABELS, components=[UniformSampler], shares=[1.0], batch_size=4, sampler=handed
    )
    assert (mixture.rank, mixture.world_size) == (1, 2)
    with pytest.raises(ValueError, match="world_size=4 was given, but the framework's"):
        fixed_class(world_size=4, sampler=handed)
    with pytest.raises(ValueError, match="sampler= takes the DistributedSampler"):
        fixed_class(sampler=torch.utils.data.RandomSampler(range(len(LABELS))))


def test_labels_that_are_a_sampler_name_the_settings_in_one_line():
    """Lightning's fallback rebuild, type(bs)(sampler, batch_size=, drop_last=)."""
    handed = DistributedSampler(range(len(LABELS)), num_replicas=2, rank=0)
    with pytest.raises(ValueError) as error:
        FixedClassSampler(handed, batch_size=6, drop_last=False)
    message = str(error.value)
    assert "\n" not in message and "got a DistributedSampler where its labels go" in message
    assert "use_distributed_sampler=False" in message and "built inside train_dataloader" in message
    assert "import samplers at the top of the module, not inside the hook" in message


def test_rank_and_world_size_are_read_when_used(tmp_path):
    """A sampler built before the process group exists shards once it is up."""
    import torch.distributed as dist

    sampler = UniformSampler(LABELS, seed=2)
    assert (sampler.rank, sampler.world_size, len(sampler)) == (0, 1, 48)
    assert sampler._from_group is None  # nothing to remember yet
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1)
    try:
        assert sampler.world_size == 1  # one rank here; the point is that it is read now
        assert sampler._from_group == (0, 1)
        pinned = UniformSampler(LABELS, seed=2, rank=1, world_size=2)
        assert (pinned.rank, pinned.world_size, len(pinned)) == (1, 2, 24)
    finally:
        dist.destroy_process_group()
    assert sampler._from_group == (0, 1)  # kept after the group is gone
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, world_size=1\)"):
        UniformSampler(LABELS, rank=1)


def test_feedback_tensors_stay_the_same_objects():
    """A strategy that assigns new tensors still updates the ones a saved state holds."""

    class Reassigning(Sampler):
        feedback_state = ("counts",)

        def __init__(self, labels, **kwargs):
            super().__init__(labels, **kwargs)
            self.counts = torch.zeros(len(self.labels), dtype=torch.float64)

        def distribution(self, epoch):
            return HardMinedSampler(self.labels).distribution(epoch)

        def observe(self, indices, losses):
            self.counts = self.counts + torch.bincount(indices, minlength=len(self.labels))

    sampler = Reassigning(LABELS)
    held = sampler.counts
    sampler.update(torch.tensor([0, 0, 5]), torch.ones(3))
    assert sampler.counts is held and held[[0, 5]].tolist() == [2.0, 1.0]


def test_state_holds_the_samplers_own_feedback_whoever_asks():
    """Like nn.Module.state_dict: what torchdata's StatefulDataLoader keeps from when it handed
    a batch to a worker holds the feedback of the moment it is serialised."""
    sampler = HardMinedSampler(LABELS, seed=3)
    state = sampler.state_dict()
    sampler.update(torch.arange(10), torch.arange(10.0))
    assert state["feedback"]["loss_ema"] is sampler.loss_ema
    assert state["feedback"]["seen"][:10].all()
    saved = copy.deepcopy(state)  # what torch.save or deepcopy keeps: the feedback as of now
    sampler.update(torch.arange(10, 20), torch.ones(10))
    restored = HardMinedSampler(LABELS, seed=3)
    restored.load_state_dict(saved)
    assert int(restored.seen.sum()) == 10
    mixture = MixtureSampler(
        LABELS, components=[HardMinedSampler], shares=[1.0], batch_size=4, seed=4
    )
    assert mixture.state_dict()["components"][0]["feedback"]["loss_ema"] is (
        mixture.components[0].loss_ema
    )


def test_a_sampler_told_its_loader_shards_yields_the_global_draw():
    """What samplers.integrations.accelerate.prepare tells a sampler, on rank 1 of 2."""
    sampler = UniformSampler(LABELS, seed=6, rank=1, world_size=2)
    own = list(sampler)
    assert len(sampler) == len(own) == 24
    sampler.loader_shards = True
    whole = UniformSampler(LABELS, seed=6)
    assert len(sampler) == 48 and list(sampler) == list(whole)
    assert own == list(whole)[1::2]


def test_accelerate_adapter_tells_the_sampler_of_a_sharding_loader():
    """Accelerate's own BatchSamplerShard, as prepare builds it for process 1 of 2: told, the
    sampler yields the whole draw and the shard hands this process the batches 1, 3, ..."""
    from accelerate.data_loader import BatchSamplerShard, DataLoaderShard

    from samplers.integrations.accelerate import tell_sampler

    sampler = UniformSampler(LABELS, seed=7)
    shard = BatchSamplerShard(BatchSampler(sampler, 4, False), num_processes=2, process_index=1)
    loader = DataLoaderShard(torch.arange(len(LABELS)), batch_sampler=shard)
    assert tell_sampler(loader) is sampler and sampler.loader_shards
    batches = [b.tolist() for b in loader]
    whole = UniformSampler(LABELS, seed=7).epoch_indices().reshape(-1, 4).tolist()
    assert batches == whole[1::2] and len(loader) == 6
    plain = UniformSampler(LABELS)
    assert tell_sampler(DataLoader(torch.arange(4), sampler=plain, batch_size=2)) is None
    assert not plain.loader_shards  # a loader that does not shard: the sampler shards itself


def test_update_across_ranks_without_a_process_group_is_update():
    sampler = HardMinedSampler(LABELS, seed=5)
    update_across_ranks(sampler, torch.tensor([1, 2]), torch.tensor([[0.5], [1.5]]))
    assert sampler.loss_ema[[1, 2]].tolist() == [0.5, 1.5]
    with pytest.raises(ValueError, match="reduction='none'"):
        update_across_ranks(sampler, torch.tensor([1, 2]), torch.tensor(1.0))
    assert gather_across_ranks(torch.ones(2, 3)).shape == (6,)


def test_find_sampler_looks_through_loaders():
    index, batches = UniformSampler(LABELS), fixed_class()
    data = torch.arange(len(LABELS))
    assert find_sampler(DataLoader(data, sampler=index, batch_size=4)) is index
    assert find_sampler({"train": [DataLoader(data, batch_sampler=batches)]}) is batches
    with pytest.raises(ValueError, match="no samplers.Sampler found in DataLoader"):
        find_sampler(DataLoader(data, batch_size=4))
