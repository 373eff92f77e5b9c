"""The README's library examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from tests.processes import check_exit

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


def test_ddp_example_runs_under_torchrun(tmp_path):
    """Two real processes (gloo): every rank ends with the same feedback state and its own
    disjoint half of one global draw."""
    import json
    import subprocess
    import sys

    (example,) = [b for b in BLOCKS if "DistributedDataParallel(" in b]
    report = (
        "\nimport json\n"
        "print('RESULT', json.dumps({'rank': sampler.rank, 'ema': sampler.loss_ema.sum().item(),"
        " 'seen': int(sampler.seen.sum()), 'indices': sampler.epoch_indices().tolist(),"
        " 'global': sampler.global_indices().tolist()}))\n"
    )
    script = tmp_path / "train_ddp.py"
    script.write_text(example + report)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_port=29517",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    results = sorted(
        (
            json.loads(line.split("RESULT ", 1)[1])
            for line in done.stdout.splitlines()
            if "RESULT " in line
        ),
        key=lambda r: r["rank"],
    )
    check_exit(done.returncode, done.stderr, completed=len(results) == 2)
    assert [r["rank"] for r in results] == [0, 1]
    assert (
        results[0]["ema"] == results[1]["ema"] and results[0]["seen"] == results[1]["seen"] > 3000
    )
    assert results[0]["global"] == results[1]["global"]
    assert results[0]["indices"] == results[0]["global"][0::2]
    assert results[1]["indices"] == results[1]["global"][1::2]
