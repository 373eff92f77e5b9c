"""A checkpoint that cannot be read or written, through the real CLI: a run stopped by SIGTERM
(one for the module, put back as it was left before each test) is resumed with its checkpoint
damaged, or with a file-size limit that refuses the next one. Each asserts the exit code, at most
three lines, no traceback, and the store and files before and after."""

from __future__ import annotations

import resource
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from tests.helpers.cli import run_cli, start_cli, wait_for
from tests.test_faults import QUICK, digest, said
from tests.test_resume import history, only_run

pytestmark = pytest.mark.slow  # the CLI end to end, training, signals

# The default width: a checkpoint (about 2.3 MB) larger than the store.
STOPPED = ["data=digits_lt", "model=small_cnn", "trainer.epochs=4", *QUICK]


@dataclass(frozen=True)
class Killed:
    """A run stopped by SIGTERM: its store, the checkpoint its tag names, and their bytes as
    the run left them."""

    uri: str
    run_id: str
    checkpoint: Path
    store_bytes: bytes
    checkpoint_bytes: bytes

    def as_left(self) -> tuple[MlflowClient, Run, Path]:
        """The store and the checkpoint put back as the run left them (a test before may have
        damaged or resumed them), in place: the run's tag names this checkpoint's path."""
        Path(self.uri.removeprefix("sqlite:///")).write_bytes(self.store_bytes)
        self.checkpoint.write_bytes(self.checkpoint_bytes)
        client = MlflowClient(self.uri)
        return client, client.get_run(self.run_id), self.checkpoint


@pytest.fixture(scope="module")
def killed(tmp_path_factory, migrated_store) -> Killed:
    """A run stopped by SIGTERM in its second epoch: KILLED, with a checkpoint (one for the
    module: the tests below take it back as it was left)."""
    folder = tmp_path_factory.mktemp("killed")
    shutil.copy(migrated_store, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    log = folder / "run.log"
    process = start_cli(*STOPPED, "trainer.batch_size=16", cwd=folder, log=log, uri=uri)
    wait_for(log, "epoch 1/4", process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 143, log.read_text()[-3000:]
    _, run = only_run(uri)
    assert run.info.status == "KILLED"
    checkpoint = Path(run.data.tags["checkpoint"])
    store = Path(uri.removeprefix("sqlite:///"))
    return Killed(uri, run.info.run_id, checkpoint, store.read_bytes(), checkpoint.read_bytes())


def test_an_unreadable_checkpoint_is_one_line_and_the_run_stays_as_it_was(killed, tmp_path):
    """Truncated, then a torch file that is not a checkpoint: each refused in one line."""
    import torch

    client, run, checkpoint = killed.as_left()
    tracking_uri = killed.uri
    before = history(client, run.info.run_id)
    damages = {
        "truncated": lambda: checkpoint.write_bytes(checkpoint.read_bytes()[:1000]),
        "not_a_checkpoint": lambda: torch.save({"weights": torch.zeros(3)}, checkpoint),
    }
    for damage, apply in damages.items():
        apply()
        done = run_cli(
            f"resume={run.info.run_id}", cwd=tmp_path, uri=tracking_uri, timeout=120, expect=2
        )
        lines = said(done.stderr)
        assert "Traceback" not in done.stderr, (damage, done.stderr)
        assert len(lines) <= 3 and str(checkpoint) in done.stderr, (damage, lines)
        _, after = only_run(tracking_uri)
        assert after.info.status == "KILLED"  # nothing was resumed: not reopened, not FAILED
        assert history(client, run.info.run_id) == before


def _file_size_limit(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_checkpoint_that_cannot_be_written_fails_the_run_and_keeps_the_previous_one(
    killed, tmp_path
):
    """A file-size limit makes the write fail as a full disk does (the OS refuses the bytes):
    the resumed run's next checkpoint cannot be written."""
    client, run, checkpoint = killed.as_left()
    tracking_uri = killed.uri
    kept = digest(checkpoint)
    store = Path(tracking_uri.removeprefix("sqlite:///")).stat().st_size
    limit = (checkpoint.stat().st_size + store) // 2  # room for the store, not the checkpoint
    assert store * 1.3 < limit
    done = run_cli(
        f"resume={run.info.run_id}",
        cwd=tmp_path,
        uri=tracking_uri,
        timeout=120,
        expect=2,
        preexec_fn=_file_size_limit(limit),
    )
    lines = said(done.stderr)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(lines) <= 3 and str(checkpoint.parent) in lines[0] and "MiB" in lines[0], lines
    assert digest(checkpoint) == kept  # the previous checkpoint, untouched
    assert not list(checkpoint.parent.glob(".*.tmp"))  # no temporary file left filling the disk
    _, after = only_run(tracking_uri)
    assert after.info.status == "FAILED"
