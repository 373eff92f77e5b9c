"""Real processes: torch.distributed (gloo) ranks, and a fresh interpreter's order."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.helpers.processes import check_exit
from tests.helpers.strategies import STRATEGIES

pytestmark = pytest.mark.ddp  # several real processes in one process group

ROOT = Path(__file__).resolve().parents[1]
LABELS = [0] * 37 + [1] * 11 + [2] * 4

RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from tests.helpers.strategies import STRATEGIES, feed_losses
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    labels = json.loads(sys.argv[4])
    out = {}
    for name, build in STRATEGIES.items():
        sampler = build(labels, seed=5)  # rank and world size come from torch.distributed
        assert (sampler.rank, sampler.world_size) == (rank, world)
        orders = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            mine = sampler.epoch_indices()
            gathered = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(gathered, mine)
            orders.append([g.tolist() for g in gathered])
            # Feedback: every rank feeds back the losses of all ranks, so states stay equal.
            everything = torch.cat([g.reshape(-1) for g in gathered])
            sampler.update(everything, (everything % 5).double())
        out[name] = {"len": len(sampler), "orders": orders}
    if rank == 0:
        print(json.dumps(out), flush=True)  # before a possible abort at exit
    dist.destroy_process_group()
""")


def run_ranks(world: int, tmp_path: Path) -> dict:
    init = f"file://{tmp_path}/rendezvous-{world}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(r), str(world), init, json.dumps(LABELS)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    # Rank 0 prints only after the last collective, which every rank had to reach.
    completed = outputs[0][0].strip().startswith("{")
    for p, (_, err) in zip(procs, outputs, strict=True):
        check_exit(p.returncode, err, completed)
    return json.loads(outputs[0][0])


def test_distributed_ranks_share_one_global_draw(tmp_path):
    results = {world: run_ranks(world, tmp_path) for world in (2, 3)}
    for name, build in STRATEGIES.items():
        single = build(LABELS, seed=5)
        for epoch in range(3):
            single.set_epoch(epoch)
            global_draw = single.global_indices().tolist()
            for world, result in results.items():
                per_rank = result[name]["orders"][epoch]
                assert len({len(r) for r in per_rank}) == 1
                assert len(per_rank[0]) == result[name]["len"]
                interleaved = [
                    per_rank[r][i] for i in range(len(per_rank[0])) for r in range(world)
                ]
                assert interleaved[: len(global_draw)] == global_draw, (name, world, epoch)
            everything = single.global_indices().reshape(-1)
            single.update(everything, (everything % 5).double())


def test_order_does_not_depend_on_the_process(tmp_path):
    script = textwrap.dedent("""
        import json, torch
        from tests.helpers.strategies import STRATEGIES
        torch.manual_seed(12345)
        out = {}
        for name, build in STRATEGIES.items():
            s = build(json.loads(__import__("sys").argv[1]), seed=9)
            s.set_epoch(4)
            out[name] = s.epoch_indices().tolist()
        print(json.dumps(out))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(LABELS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    theirs = json.loads(done.stdout)
    for name, build in STRATEGIES.items():
        s = build(LABELS, seed=9)
        s.set_epoch(4)
        assert s.epoch_indices().tolist() == theirs[name], name


def test_a_user_strategy_inherits_the_protocol():
    """The usage-balanced sampler of docs/samplers.md: weights 1 / (times drawn so far + 1)."""
    from samplers import Sampler, SampleWeights

    class UsageBalanced(Sampler):
        feedback_state = ("times_drawn",)

        def __init__(self, labels, **kwargs):
            super().__init__(labels, **kwargs)
            self.times_drawn = torch.zeros(len(self.labels), dtype=torch.float64)

        def distribution(self, epoch):
            return SampleWeights(1.0 / (self.times_drawn + 1.0))

        def observe(self, indices, losses):
            self.times_drawn.index_add_(0, indices, torch.ones_like(losses))

    sampler = UsageBalanced(LABELS, num_samples=30, seed=1, world_size=2, rank=1)
    assert len(sampler) == len(list(sampler)) == 15
    sampler.update(torch.arange(10), torch.zeros(10))
    sampler.set_epoch(1)
    state = sampler.state_dict()
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(4)]
    restored = UsageBalanced(LABELS, num_samples=30, seed=1, world_size=2, rank=1)
    restored.load_state_dict(sampler.state_dict())
    assert head + list(restored) == list(sampler)
    assert torch.equal(state["feedback"]["times_drawn"][:10], torch.ones(10, dtype=torch.float64))
    # Samples drawn before now weigh half as much as fresh ones.
    assert torch.allclose(
        sampler.current_distribution().weights[:11],
        torch.tensor([0.5] * 10 + [1.0], dtype=torch.float64),
    )


def test_large_draws_still_work_in_a_forked_child():
    """The drawing thread pool does not survive fork(); a child must start its own."""
    import multiprocessing

    labels = torch.arange(300_000) % 7  # several chunks: the pool is used
    parent = STRATEGIES["weighted"](labels, seed=2).epoch_indices()
    with multiprocessing.get_context("fork").Pool(1) as pool:
        child = pool.apply_async(_draw_in_child, (labels,)).get(timeout=60)
    assert torch.equal(child, parent)


def _draw_in_child(labels: torch.Tensor) -> torch.Tensor:
    # torch's own OpenMP kernels are not fork-safe once the parent used them; like DataLoader
    # workers, the child runs them on one thread. What is tested is samplerlab's chunk pool.
    torch.set_num_threads(1)
    return STRATEGIES["weighted"](labels, seed=2).epoch_indices()
