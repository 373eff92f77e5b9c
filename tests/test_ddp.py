"""Data-parallel runs under real torchrun (2 ranks, gloo on the CPU) against one process: the same
metrics, one MLflow run per torchrun, a dead rank ends the run FAILED, SIGTERM ends it KILLED
and resume continues it under torchrun, a batch the ranks cannot share and a sweep (-m) under
torchrun are user errors.

Every process starts at once (module fixture): on 2 cores their imports overlap."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from runner.data import Augment, augment_batch
from tests.helpers.processes import check_exit
from tests.helpers.record import assert_record

pytestmark = pytest.mark.ddp  # several real processes in one process group

TORCHRUN = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2"]
SAMPLERS = ("uniform", "hard_mined", "fixed_class")
# 1,812 training samples: 14 global batches of 128 and one of 20, which two ranks share evenly,
# so the 2-rank epoch is the 1-rank epoch without padding (fixed_class: 14 batches of 8 x 16).
CONFIG = [
    "data.n_max=200",
    "data.val_per_class=5",
    "data.imbalance_factor=10",
    "trainer.epochs=8",
    "trainer.classifier_epochs=2",  # and cRT's stage two: DDP rebuilt around the classifier
    "trainer.batch_size=128",
    "trainer.progress=false",
    "tracking.plots=false",
]
# Only the uniform run's test loads its model; logging one costs a run ~5 s of CPU (torch.export,
# MLflow's environment checks), and this module starts seven commands at once on two cores.
UNLOGGED = [*CONFIG, "tracking.log_model=false"]
# Measured on the CPU with torch 2.14: every metric of the 2-rank runs equals the 1-rank run's
# to the last digit except train/loss (|diff| <= 1.6e-7) and hard_mined's sampling targets
# (<= 1.4e-9): averaging two half-batch gradients adds in another float32 order than one
# whole-batch mean. Such differences flip a test prediction only for a sample within ~1e-6 of a
# decision boundary; the tolerance allows two flips in the 1,000 balanced test samples.
FINAL_TOLERANCE = 0.002  # final/accuracy, final/balanced_accuracy, final/macro_f1
LOSS_TOLERANCE = 1e-5  # relative, train/loss at every epoch
SAMPLING_TOLERANCE = 1e-6  # sampling/* at every epoch: the same draws and feedback


def _store(folder: Path, template: Path) -> str:
    folder.mkdir()
    shutil.copy(template, folder / "mlflow.db")
    return f"sqlite:///{folder / 'mlflow.db'}"


def _start(command: list[str], cwd: Path) -> tuple[subprocess.Popen, Path]:
    log = cwd / "run.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return process, log


def _rank_pid(torchrun: subprocess.Popen, rank: int) -> int:
    """The worker process torchrun started for ``rank`` (its child with RANK=rank)."""
    for child in Path(f"/proc/{torchrun.pid}/task/{torchrun.pid}/children").read_text().split():
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(child)
    raise AssertionError(f"no rank {rank} among the children of torchrun {torchrun.pid}")


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("samplerlab")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def _history(uri: str, run_id: str) -> dict[str, dict[int, float]]:
    client = MlflowClient(uri)
    return {
        key: {m.step: m.value for m in client.get_metric_history(run_id, key)}
        for key in client.get_run(run_id).data.metrics
    }


def _finished(process: subprocess.Popen, log: Path, uri: str, timeout: float = 300):
    """The one run of a torchrun that must succeed (a gloo abort after its work is forgiven)."""
    returncode = process.wait(timeout=timeout)
    runs = _runs(uri)
    assert len(runs) == 1, [r.info.run_id for r in runs]  # one MLflow run per torchrun
    text = log.read_text()
    check_exit(returncode, text, completed=runs[0].info.status == "FINISHED")
    assert runs[0].info.status == "FINISHED", text[-3000:]
    return runs[0]


@pytest.fixture(scope="module")
def launched(tmp_path_factory, migrated_store):
    """Starts everything; stops the two runs that must be stopped at epoch 2 of 10."""
    root = tmp_path_factory.mktemp("ddp")
    started = {}

    def start(name: str, command: list[str]) -> None:
        uri = _store(root / name, migrated_store)
        started[name] = (*_start([*command, f"tracking.uri={uri}"], root / name), uri)

    run = [sys.executable, "-m", "runner"]
    start("one", [*run, "-m", f"sampler={','.join(SAMPLERS)}", *UNLOGGED, "trainer.threads=1"])
    for sampler in SAMPLERS:
        overrides = CONFIG if sampler == "uniform" else UNLOGGED
        start(sampler, [*TORCHRUN, "-m", "runner", f"sampler={sampler}", *overrides])
    start("killed_rank", [*TORCHRUN, "-m", "runner", "sampler=hard_mined", *UNLOGGED])
    start("odd_batch", [*TORCHRUN, "-m", "runner", *UNLOGGED, "trainer.batch_size=127"])
    start("sweep", [*TORCHRUN, "-m", "runner", "-m", "seed=0,1", *UNLOGGED])
    # hard_mined is stopped by SIGTERM to torchrun and resumed in its test; the other run loses
    # rank 1 to SIGKILL. Both in the third epoch, just after rank 0 logged the second.
    stops = {
        "hard_mined": lambda process: process.send_signal(signal.SIGTERM),
        "killed_rank": lambda process: os.kill(_rank_pid(process, 1), signal.SIGKILL),
    }
    deadline = time.monotonic() + 240
    while stops:
        for name in [n for n in stops if "epoch 2/10" in started[n][1].read_text()]:
            time.sleep(0.1)  # into the third epoch
            stops.pop(name)(started[name][0])
        for name in stops:
            process, log, _ = started[name]
            assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"not at epoch 2 in time: {sorted(stops)}"
        time.sleep(0.05)
    yield started
    for process, _, _ in started.values():
        if process.poll() is None:
            process.kill()


@pytest.fixture(scope="module")
def one_process(launched) -> dict[str, dict[str, dict[int, float]]]:
    """The 1-rank runs (one CLI sweep), by sampler: metric -> step -> value."""
    process, log, uri = launched["one"]
    assert process.wait(timeout=300) == 0, log.read_text()[-3000:]
    runs = [r for r in _runs(uri) if r.data.tags.get("sweep") != "parent"]
    return {r.data.params["sampler"]: _history(uri, r.info.run_id) for r in runs}


def _assert_same(two: dict[str, dict[int, float]], one: dict[str, dict[int, float]]) -> None:
    assert two.keys() == one.keys()
    for key in one:
        assert two[key].keys() == one[key].keys(), key  # every epoch logged once
    for key in ("final/accuracy", "final/balanced_accuracy", "final/macro_f1"):
        assert two[key] == pytest.approx(one[key], abs=FINAL_TOLERANCE), key
    assert two["train/loss"] == pytest.approx(one["train/loss"], rel=LOSS_TOLERANCE)
    for key in (k for k in one if k.startswith("sampling/") and k != "sampling/imbalance_ratio"):
        assert two[key] == pytest.approx(one[key], abs=SAMPLING_TOLERANCE), key
    ratios = "sampling/imbalance_ratio"  # infinite when a class was never drawn
    for step, value in one[ratios].items():
        assert math.isclose(two[ratios][step], value, rel_tol=SAMPLING_TOLERANCE), step


@pytest.mark.parametrize("sampler", ["uniform", "fixed_class"])
def test_two_ranks_train_as_one_process_with_the_global_batch(sampler, launched, one_process):
    process, log, uri = launched[sampler]
    run = _finished(process, log, uri)
    _assert_same(_history(uri, run.info.run_id), one_process[sampler])
    if sampler == "uniform":  # the record says two processes trained it, and keeps the model
        contexts = {"training", "validation", "test"}
        assert_record(uri, run.info.run_id, [*CONFIG, f"sampler={sampler}"], contexts, 2)
        assert run.data.tags["backend"] == "gloo"


def test_sigterm_to_torchrun_kills_the_run_and_resume_finishes_it(launched, one_process):
    """hard_mined (feedback gathered from both ranks), stopped mid-training and resumed under
    torchrun, ends with the uninterrupted 1-rank run's history."""
    process, log, uri = launched["hard_mined"]
    process.wait(timeout=120)
    (run,) = _runs(uri)
    assert run.info.status == "KILLED", log.read_text()[-3000:]
    assert Path(run.data.tags["checkpoint"]).is_file()  # written by rank 0
    told = [line for line in log.read_text().splitlines() if "continue it with" in line]
    assert len(told) == 1, told  # rank 0 alone says it
    assert f"torchrun --standalone --nproc_per_node=2 -m runner resume={run.info.run_id}" in told[0]
    folder = log.parent
    log.rename(folder / "stopped.log")
    again, log = _start(
        [*TORCHRUN, "-m", "runner", f"resume={run.info.run_id}", f"tracking.uri={uri}"], folder
    )
    resumed = _finished(again, log, uri)
    assert resumed.info.run_id == run.info.run_id
    assert "resuming run" in log.read_text()
    _assert_same(_history(uri, run.info.run_id), one_process["hard_mined"])


def test_a_rank_that_dies_fails_the_run(launched):
    process, log, uri = launched["killed_rank"]
    assert process.wait(timeout=120) != 0
    (run,) = _runs(uri)
    assert run.info.status == "FAILED", log.read_text()[-3000:]


def test_a_sweep_under_torchrun_is_a_user_error_before_any_run(launched):
    process, log, uri = launched["sweep"]
    assert process.wait(timeout=120) != 0
    assert "samplerlab: -m under torchrun: torchrun trains one run at a time" in log.read_text()
    assert _runs(uri) == []  # no parent run, no job


def test_a_batch_the_ranks_cannot_share_is_a_user_error(launched):
    process, log, uri = launched["odd_batch"]
    assert process.wait(timeout=120) != 0
    text = log.read_text()
    assert (
        "samplerlab: trainer.batch_size=127 is the global batch, split over 2 processes, which "
        "it does not divide; use a multiple of 2"
    ) in text
    assert "[rank0]: Traceback" not in text and "[rank1]: Traceback" not in text
    assert _runs(uri) == []  # before any tracking


def test_each_rank_augments_its_share_as_one_process_would():
    x = torch.randn(8, 3, 6, 6)
    augment = Augment(crop_padding=2, flip=True)
    one = torch.Generator().manual_seed(0)
    whole = augment_batch(x, augment, one)
    for rank in range(2):
        generator = torch.Generator().manual_seed(0)
        part = augment_batch(x[rank::2], augment, generator, share=(rank, 2))
        assert torch.equal(part, whole[rank::2])
        assert torch.equal(generator.get_state(), one.get_state())  # the next batch: in step
