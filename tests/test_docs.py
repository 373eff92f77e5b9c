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


def test_ddp_example_runs_as_two_ranks(tmp_path):
    """Two real processes (gloo), launched with the environment torchrun sets, each on its own so
    that gloo's teardown abort in one cannot take the other down: every rank ends with the same
    feedback state and its own disjoint half of one global draw."""
    import json
    import os
    import socket
    import subprocess
    import sys

    (example,) = [b for b in BLOCKS if "DistributedDataParallel(" in b]
    report = (
        "\nimport json\n"
        "print('RESULT', json.dumps({'rank': sampler.rank, 'ema': sampler.loss_ema.sum().item(),"
        " 'seen': int(sampler.seen.sum()), 'indices': sampler.epoch_indices().tolist(),"
        " 'global': sampler.global_indices().tolist()}), flush=True)\n"
    )
    script = tmp_path / "train_ddp.py"
    script.write_text(example + report)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "OMP_NUM_THREADS": "1",
            },
        )
        for rank in range(2)
    ]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=300)
        lines = [
            line.split("RESULT ", 1)[1] for line in out.splitlines() if line.startswith("RESULT ")
        ]
        check_exit(rank.returncode, err, completed=len(lines) == 1)
        results.append(json.loads(lines[0]))
    assert [r["rank"] for r in results] == [0, 1]
    assert (
        results[0]["ema"] == results[1]["ema"] and results[0]["seen"] == results[1]["seen"] > 3000
    )
    assert results[0]["global"] == results[1]["global"]
    assert results[0]["indices"] == results[0]["global"][0::2]
    assert results[1]["indices"] == results[1]["global"][1::2]
