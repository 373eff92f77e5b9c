"""Checkpoints under a prefetching DataLoader, restored in a new process; thread independence."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers.strategies import STRATEGIES, feed_losses

pytestmark = pytest.mark.unit  # in one process, seconds

ROOT = Path(__file__).resolve().parents[1]
LABELS = [0] * 180 + [1] * 80 + [2] * 40
BATCH = 10
CONSUMED = 3  # batches the training loop has taken when it saves
NAMES = ["uniform", "weighted", "hard_mined", "fixed_class", "mixture"]


def loader(sampler, workers: int) -> DataLoader:
    dataset = torch.arange(len(LABELS))
    if sampler.batch_size:
        return DataLoader(dataset, batch_sampler=sampler, num_workers=workers)
    return DataLoader(dataset, sampler=sampler, batch_size=BATCH, num_workers=workers)


def prepared(name: str):
    sampler = STRATEGIES[name](LABELS, seed=4)
    feed_losses(sampler)  # feedback strategies move off their start
    sampler.set_epoch(1)
    return sampler


RESTORE = textwrap.dedent("""
    import json, sys, torch
    from tests.test_samplers_checkpoint import loader, prepared
    out = {}
    for name in sys.argv[2:]:
        sampler = prepared(name)
        sampler.load_state_dict(torch.load(f"{sys.argv[1]}/{name}.pt", weights_only=True))
        out[name] = {"len": len(sampler), "batches": [b.tolist() for b in loader(sampler, 2)]}
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_checkpoint_after_k_consumed_batches_resumes_in_a_new_process(tmp_path):
    expected = {}
    for name in NAMES:
        sampler = prepared(name)
        full = [b.tolist() for b in loader(sampler, 0)]
        iterator = iter(loader(sampler, 2))  # two workers, each prefetching two batches
        head = [next(iterator).tolist() for _ in range(CONSUMED)]
        assert head == full[:CONSUMED]
        units = CONSUMED if sampler.batch_size else CONSUMED * BATCH
        # What the sampler has handed out runs ahead of what was consumed.
        assert sampler.state_dict()["position"] > units
        torch.save(sampler.state_dict(consumed=units), tmp_path / f"{name}.pt")
        del iterator
        expected[name] = (len(sampler), full[CONSUMED:])
    done = subprocess.run(
        [sys.executable, "-c", RESTORE, str(tmp_path), *NAMES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    restored = json.loads(done.stdout)
    for name in NAMES:
        length, rest = expected[name]
        assert restored[name]["len"] == length, "len() stays the whole epoch's after a restore"
        assert restored[name]["batches"] == rest, name


def test_consumed_outside_what_was_handed_out_is_refused():
    sampler = prepared("uniform")
    iterator = iter(sampler)
    for _ in range(5):
        next(iterator)
    with pytest.raises(ValueError, match=r"consumed=6 is outside \[0, 5\]"):
        sampler.state_dict(consumed=6)
    restored = prepared("uniform")
    restored.load_state_dict(sampler.state_dict(consumed=4))
    list(iter(restored))
    with pytest.raises(ValueError, match=r"consumed=2 is outside \[4, 300\]"):
        restored.state_dict(consumed=2)  # counted from the epoch's start, not the restore


THREADS = textwrap.dedent("""
    import hashlib, json, sys, threading, torch
    torch.set_num_threads(int(sys.argv[1]))
    from tests.helpers.strategies import STRATEGIES, feed_losses
    labels = torch.arange(70_000) % 7  # two chunks of the drawing pool
    out = {}
    for name, build in STRATEGIES.items():
        sampler = build(labels, seed=6)
        feed_losses(sampler)
        sampler.set_epoch(1)
        data = sampler.epoch_indices().numpy().tobytes()
        out[name] = hashlib.sha256(data).hexdigest()
    from samplers._shuffle import SEQUENTIAL_MAX, permutation
    large = permutation(SEQUENTIAL_MAX + 1, 6)  # a bucket shuffle, in chunks on the pool
    out["large permutation"] = hashlib.sha256(large.numpy().tobytes()).hexdigest()
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    out["threads in a new thread"] = seen[0]
    print(json.dumps(out))
""")


def test_results_do_not_depend_on_the_thread_count():
    procs = {
        threads: subprocess.Popen(
            [sys.executable, "-c", THREADS, str(threads)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for threads in (1, 2)
    }
    runs = {}
    for threads, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        runs[threads] = json.loads(out)
    # The drawing pool runs torch single-threaded on its own threads only.
    assert runs[1].pop("threads in a new thread") == 1
    assert runs[2].pop("threads in a new thread") == 2
    assert runs[1] == runs[2]
    assert set(runs[1]) == {*STRATEGIES, "large permutation"}
