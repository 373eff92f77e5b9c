"""The samplers inside real training frameworks: Lightning's Trainer and Fabric, Accelerate, the
Hugging Face Trainer and torchdata's StatefulDataLoader, each with its defaults, in two gloo
processes for 3 epochs; and the examples of docs/trainers.md, run as written.

One launch of two ranks runs every scenario (``tests/helpers/frameworks``); each rank reports
the indices it was given, epoch by epoch. This process checks them against the samplers' own
lists for ``rank=r, world_size=2``, built here without any framework: every rank gets its share
of the one global draw, each epoch once, and epochs (and schedules) advance with the
framework's. Install the frameworks with ``make install-frameworks``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from samplers import (
    AnnealedSampler,
    DeferredSampler,
    FixedClassSampler,
    HardMinedSampler,
    ProgressiveSampler,
    Sampler,
    WeightedSampler,
)
from tests.helpers.frameworks.data import BATCH, EPOCHS, WORLD, labels
from tests.helpers.frameworks.rank import ALONE, DOC_EXAMPLES, SCENARIOS
from tests.helpers.processes import check_exit

pytestmark = pytest.mark.ddp  # several real processes in one process group

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("lightning", "accelerate", "torchdata", "transformers")

missing = [name for name in FRAMEWORKS if importlib.util.find_spec(name) is None]
if missing:  # a failure, not a skip: a suite without them would pass without testing them
    raise ImportError(f"{', '.join(missing)} not installed: run `make install-frameworks`")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch(names: list[str], folder: Path, timeout: float = 420) -> list[dict[str, Any]]:
    """Run the scenarios in two ranks, with the environment torchrun gives them; every rank's
    results by scenario name. Each rank is its own process, so that gloo's teardown abort in
    one cannot take the other down, and writes to files: a rank blocked on a full pipe would
    stall the other at the next collective."""
    base = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(WORLD),
        "LOCAL_WORLD_SIZE": str(WORLD),
        "GROUP_RANK": "0",
        "TORCHELASTIC_RUN_ID": "samplerlab-frameworks",
        "OMP_NUM_THREADS": "1",
    }
    logs = [(folder / f"rank{rank}.out", folder / f"rank{rank}.err") for rank in range(WORLD)]
    ranks = []
    for rank, (out, err) in enumerate(logs):
        with out.open("w") as stdout, err.open("w") as stderr:
            ranks.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.helpers.frameworks.rank", *names],
                    cwd=ROOT,
                    stdout=stdout,
                    stderr=stderr,
                    env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                )
            )
    try:
        for rank in ranks:
            rank.wait(timeout=timeout)
    finally:
        for rank in ranks:
            rank.kill()
    results = []
    for rank, (out, err) in zip(ranks, logs, strict=True):
        text = out.read_text()
        check_exit(rank.returncode, err.read_text(), completed="\nDONE" in text)
        lines = [line.split(" ", 2) for line in text.splitlines() if line.startswith("RESULT ")]
        results.append({name: json.loads(value) for _, name, value in lines})
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return launch(list(SCENARIOS), tmp_path_factory.mktemp("frameworks"))


def result(ranks: list[dict[str, Any]], name: str, rank: int) -> dict[str, Any]:
    out = ranks[rank][name]
    assert "crashed" not in out, out.get("crashed")
    return out


def own_lists(sampler: Sampler, after: list[dict[str, Any]] | None = None) -> list[list[int]]:
    """The sampler's own indices for each epoch (flattened), given the feedback it held after
    each epoch (``after``, from the rank) when it has feedback."""
    lists = []
    for epoch in range(EPOCHS):
        if after and epoch > 0:
            for name in sampler.feedback_state:
                saved = torch.tensor(after[epoch - 1][name])
                setattr(sampler, name, saved.to(getattr(sampler, name).dtype))
        sampler.set_epoch(epoch)
        lists.append(sampler.epoch_indices().reshape(-1).tolist())
    return lists


def check_own_lists(ranks: list[dict[str, Any]], name: str, build: Any) -> None:
    for rank in range(WORLD):
        out = result(ranks, name, rank)
        expected = own_lists(build(rank=rank, world_size=WORLD), out["after"])
        assert out["epochs"] == expected, f"{name}: rank {rank}"
        assert [state["epoch"] for state in out["after"]] == list(range(EPOCHS))


def check_global_feedback(ranks: list[dict[str, Any]], name: str) -> None:
    """Both ranks hold the same feedback after every epoch, and it covers what both drew."""
    first, second = (result(ranks, name, rank) for rank in range(WORLD))
    assert first["after"] == second["after"]
    drawn = set(first["epochs"][0]) | set(second["epochs"][0])
    seen = {i for i, flag in enumerate(first["after"][0]["seen"]) if flag}
    assert seen == drawn


def fixed_class(seed: int) -> Any:
    def build(**place: int) -> FixedClassSampler:
        return FixedClassSampler(
            labels(), classes_per_batch=4, samples_per_class=4, seed=seed, **place
        )

    return build


# ----------------------------------------------------------------------------- Lightning
def test_lightning_index_sampler_built_before_the_process_group(ranks):
    """The issue's case (WeightedSampler as sampler=, built in the data module's __init__):
    each rank gets its half of the epoch, not a quarter."""
    check_own_lists(ranks, "lightning_index", lambda **p: WeightedSampler(labels(), q=0.0, **p))
    assert result(ranks, "lightning_index", 0)["built_before_process_group"]
    assert not result(ranks, "lightning_index", 0)["rebuilt"]  # Lightning left it in place
    halves = [set(result(ranks, "lightning_index", r)["epochs"][0]) for r in range(WORLD)]
    assert len(result(ranks, "lightning_index", 0)["epochs"][0]) == 400 // WORLD
    assert halves[0] != halves[1]


def test_lightning_schedule_follows_the_trainers_epoch(ranks):
    check_own_lists(
        ranks,
        "lightning_schedule",
        lambda **p: AnnealedSampler(labels(), total_epochs=EPOCHS, seed=1, **p),
    )


def test_lightning_batch_sampler_rebuilt_with_lightnings_sharding(ranks):
    check_own_lists(ranks, "lightning_batch", fixed_class(2))
    assert result(ranks, "lightning_batch", 0)["rebuilt"]  # around Lightning's sharding


def test_lightning_batch_sampler_it_cannot_rebuild_fails_naming_the_setting(ranks):
    for rank in range(WORLD):
        error = result(ranks, "lightning_batch_outside_hook", rank)["error"]
        assert error is not None and "\n" not in error
        assert "use_distributed_sampler=False" in error and "built inside train_dataloader" in error


def test_lightning_batch_sampler_imported_inside_the_hook_names_the_import(tmp_path):
    """Built in train_dataloader as the docs say, but with samplers first imported there:
    Lightning captured no arguments (the class did not exist when it called the hook), and the
    message says so and how to fix it, rather than only "build it in the hook"."""
    alone = launch(list(ALONE), tmp_path)
    for rank in range(WORLD):
        out = result(alone, "lightning_lazy_import", rank)
        assert out["imported_before_hook"] is False  # the case itself: a lazy import
        error = out["error"]
        assert error is not None and "\n" not in error
        assert "already imported when Lightning called the hook" in error
        assert "import samplers at the top of the module, not inside the hook" in error


def test_lightning_without_distributed_sampler_advances_epochs(ranks):
    check_own_lists(ranks, "lightning_no_distributed_sampler", fixed_class(3))
    epochs = result(ranks, "lightning_no_distributed_sampler", 0)["epochs"]
    assert epochs[0] != epochs[1] != epochs[2]


def test_lightning_callback_feeds_back_every_ranks_losses(ranks):
    check_own_lists(
        ranks, "lightning_feedback", lambda **p: HardMinedSampler(labels(), seed=4, **p)
    )
    check_global_feedback(ranks, "lightning_feedback")


# ----------------------------------------------------------------------------- Fabric
def test_fabric_index_sampler_with_its_schedule(ranks):
    check_own_lists(
        ranks,
        "fabric_index",
        lambda **p: DeferredSampler(labels(), switch_epoch=1, seed=5, **p),
    )


def test_fabric_batch_sampler_under_launch(ranks):
    check_own_lists(ranks, "fabric_batch", fixed_class(7))
    assert result(ranks, "fabric_batch", 0)["rebuilt"]


def test_fabric_feedback_helper(ranks):
    check_own_lists(ranks, "fabric_feedback", lambda **p: HardMinedSampler(labels(), seed=6, **p))
    check_global_feedback(ranks, "fabric_feedback")


# ----------------------------------------------------------------------------- Accelerate
def check_batches_of_the_global_draw(ranks, name: str, build: Any) -> None:
    """Accelerate hands process r the batches r, r + 2, ... of what it reads: the ranks'
    batches taken in turn are the global draw, once, then a few from its start (the padding
    that evens out the ranks)."""
    first, second = (result(ranks, name, rank) for rank in range(WORLD))
    sampler = build(rank=0, world_size=1)  # one process: the global draw
    for epoch, draw in enumerate(own_lists(sampler, first["after"])):
        taken = [
            index
            for pair in zip(first["batches"][epoch], second["batches"][epoch], strict=True)
            for batch in pair
            for index in batch
        ]
        assert taken[: len(draw)] == draw, f"{name}: epoch {epoch}"
        assert taken[len(draw) :] == draw[: len(taken) - len(draw)]
        assert len(taken) - len(draw) < WORLD * BATCH
    for out in (first, second):
        assert out["len"] == len(out["batches"][0]) == -(-400 // BATCH // WORLD)


def test_accelerate_index_sampler_is_sharded_once(ranks):
    check_batches_of_the_global_draw(
        ranks,
        "accelerate_index",
        lambda **p: ProgressiveSampler(labels(), total_epochs=EPOCHS, seed=8, **p),
    )


def test_accelerate_dispatching_batches_deals_out_the_global_draw(ranks):
    check_batches_of_the_global_draw(
        ranks,
        "accelerate_dispatch",
        lambda **p: ProgressiveSampler(labels(), total_epochs=EPOCHS, seed=14, **p),
    )


def test_accelerate_batch_sampler_gives_its_own_lists(ranks):
    check_own_lists(ranks, "accelerate_batch", fixed_class(9))


def test_accelerate_plain_prepare_is_refused_naming_the_adapter(ranks):
    """accelerator.prepare alone would give each process a shard of its shard: the sampler,
    not told, refuses in one line. This reads Accelerate's process state; an Accelerate that
    changes accelerate.state.is_initialized or AcceleratorState fails here."""
    for rank in range(WORLD):
        error = result(ranks, "accelerate_plain_prepare", rank)["error"]
        assert error is not None and "\n" not in error
        assert "one of 2 processes that Accelerate runs" in error
        assert "samplers.integrations.accelerate.prepare(accelerator" in error
        assert "rank= and world_size=" in error


def test_accelerate_feedback_helper(ranks):
    check_batches_of_the_global_draw(
        ranks, "accelerate_feedback", lambda **p: HardMinedSampler(labels(), seed=10, **p)
    )
    check_global_feedback(ranks, "accelerate_feedback")


# ----------------------------------------------------------------------------- HF Trainer
def test_transformers_trainer_index_sampler_with_feedback(ranks):
    check_batches_of_the_global_draw(
        ranks, "transformers_index", lambda **p: HardMinedSampler(labels(), seed=12, **p)
    )
    check_global_feedback(ranks, "transformers_index")


def test_transformers_trainer_batch_sampler(ranks):
    check_own_lists(ranks, "transformers_batch", fixed_class(13))


# ----------------------------------------------------------------------------- torchdata
def test_stateful_dataloader_resumes_mid_epoch_with_the_feedback(ranks):
    """Stopped after 5 batches of epoch 1 (two workers prefetching), restored into new
    objects: the rest of epoch 1, epoch 2 (drawn from the feedback) and the final feedback
    are those of the run that never stopped."""
    for rank in range(WORLD):
        out = result(ranks, "stateful_resume", rank)
        whole, first, resumed = out["whole"], out["first"], out["resumed"]
        stop = 5 * BATCH
        assert (
            whole["epochs"][0]
            == own_lists(HardMinedSampler(labels(), seed=11, rank=rank, world_size=WORLD))[0]
        )
        assert first["epochs"][:1] == whole["epochs"][:1]
        assert first["epochs"][1] == whole["epochs"][1][:stop]
        assert resumed["epochs"][1] == whole["epochs"][1][stop:], "the rest of epoch 1"
        assert resumed["epochs"][2] == whole["epochs"][2], "epoch 2, drawn from the feedback"
        assert resumed["after"] == whole["after"][1:], "the feedback after epochs 1 and 2"


# ----------------------------------------------------------------------------- the docs
@pytest.mark.parametrize("example", DOC_EXAMPLES)
def test_docs_example_runs_on_two_ranks(ranks, example):
    """Each example of docs/trainers.md trains 3 epochs on both ranks, which end with the same
    sampler state: the same epoch, target and (with feedback) the same feedback."""
    first, second = (result(ranks, f"docs_{example}", rank) for rank in range(WORLD))
    assert first["epoch"] == EPOCHS - 1
    assert first == second
    if "seen" in first:
        assert sum(first["seen"]) > len(first["seen"]) // 2
