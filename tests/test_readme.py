"""The README's library examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_dataloader_example_runs(capsys):
    (example,) = [b for b in BLOCKS if "AnnealedSampler(y" in b]
    exec(compile(example, "README.md", "exec"), {})
    tail_shares = [float(line.split()[1]) for line in capsys.readouterr().out.splitlines()]
    assert len(tail_shares) == 5 and tail_shares[0] > tail_shares[-1]  # class-balanced -> instance


def test_custom_strategy_example_inherits_the_protocol():
    (example,) = [b for b in BLOCKS if "class UsageBalancedSampler" in b]
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    sampler = scope["UsageBalancedSampler"](
        [0, 0, 0, 1, 1, 2], num_samples=12, seed=0, world_size=2, rank=0
    )
    assert len(sampler) == len(list(sampler)) == 6
    sampler.update(torch.tensor([0, 0, 5]), torch.zeros(3))
    sampler.set_epoch(1)
    assert torch.allclose(
        sampler.current_distribution().weights[[0, 1, 5]],
        torch.tensor([1 / 3, 1.0, 0.5], dtype=torch.float64),
    )
