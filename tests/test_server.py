"""A real PostgreSQL and a real `mlflow server` (`python -m runner.tracking.server`), started once for the
module: a joblib sweep into them read back complete, sweeps at once into a fresh experiment, and
the conflicts two jobs meet when they create the same thing at the same moment, made certain by
holding the other job's insert open in a real PostgreSQL transaction."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from mlflow.entities import DatasetInput, InputTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from runner.tracking import Tracker
from runner.tracking.runs import experiment_id
from runner.tracking.server import free_port, wait_until_healthy
from runner.tracking.stores import already_exists

HAS_POSTGRES = bool(
    shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
)
pytestmark = [
    pytest.mark.postgres,  # a real PostgreSQL and MLflow server
    pytest.mark.skipif(
        not HAS_POSTGRES and not os.environ.get("CI"),
        reason="PostgreSQL is not installed (make install-server); CI always runs this",
    ),
]

SERVER = [sys.executable, "-m", "runner.tracking.server"]


@dataclass(frozen=True)
class Server:
    url: str
    database: str  # a libpq connection string for the server's PostgreSQL
    folder: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Where the postgres user may go (pytest's own temporary folders are root's alone).
    folder = Path(tempfile.mkdtemp(prefix="samplerlab-server-", dir="/var/tmp"))
    folder.chmod(0o755)
    port, db_port = free_port(), free_port()
    # To a file: a pipe nobody reads fills with the server's request log and stalls the server.
    log = tmp_path_factory.mktemp("server") / "server.log"
    process = subprocess.Popen(
        [*SERVER, "--port", str(port), "--db-port", str(db_port), "--folder", str(folder)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        yield Server(url, f"host=127.0.0.1 port={db_port} user=postgres dbname=mlflow", folder)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90) == 0, log.read_text()[-3000:]
        assert not (folder / "postgres" / "data" / "postmaster.pid").exists()  # stopped too
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Sweep:
    """A sweep started in ``folder``, its output going to files there (pipes that nobody reads
    while another sweep is waited for would fill and stall it)."""

    process: subprocess.Popen
    folder: Path

    def finished(self, timeout: float = 600) -> None:
        assert self.process.wait(timeout=timeout) == 0, (self.folder / "stderr").read_text()[-3000:]


def sweep(url: str, folder: Path, *overrides: str) -> Sweep:
    """``python -m runner -m hydra/launcher=joblib ...`` into the server, started, not waited for,
    in ``folder`` (two sweeps started in one second in one folder would share an output folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "runner", "-m", "hydra/launcher=joblib", "tracking=server"]
    with (folder / "stdout").open("w") as out, (folder / "stderr").open("w") as err:
        process = subprocess.Popen(
            [*command, f"tracking.uri={url}", *overrides], cwd=folder, stdout=out, stderr=err
        )
    return Sweep(process, folder)


def test_sweeps_at_once_into_a_fresh_experiment_finish_every_job(server, tmp_path):
    """Two joblib sweeps of four jobs each, at once (two workers each: four jobs at a time),
    into one new experiment: their parents create it together, their jobs log the same new
    datasets together, and one sweep's jobs register their models under one name together;
    the other's record everything a run records (every epoch's metrics, the figures, the
    checkpoint) through the server into its own artifact folder.
    Each round into a new experiment, so that every creation races again: one round in the
    suite (a round takes minutes on two cores; the forced-conflict tests below make the race
    certain), more with SAMPLERLAB_SERVER_ROUNDS=10."""
    client = MlflowClient(server.url)
    for round_ in range(int(os.environ.get("SAMPLERLAB_SERVER_ROUNDS", "1"))):
        name, model = f"at-once-{round_}", f"at-once-model-{round_}"
        common = [
            "hydra.launcher.n_jobs=2",
            "seed=0,1",
            "trainer.progress=false",
            "data.n_max=100",
            f"tracking.experiment={name}",
        ]
        sweeps = [
            sweep(
                server.url,
                tmp_path / f"{round_}-a",
                *common,
                "sampler=uniform,hard_mined",
                "trainer.epochs=2",
                "tracking.log_model=false",
            ),
            sweep(
                server.url,
                tmp_path / f"{round_}-b",
                *common,
                "trainer.epochs=1",
                "tracking.plots=false",
                "sampler=uniform,weighted",
                f"tracking.register={model}",
            ),
        ]
        for started in sweeps:
            started.finished()
        runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
        assert len(runs) == 2 + 8 and {r.info.status for r in runs} == {"FINISHED"}, round_
        children = [
            client.get_run(r.info.run_id) for r in runs if "mlflow.parentRunId" in r.data.tags
        ]
        for child in children:
            logged = {d.dataset.name for d in child.inputs.dataset_inputs}
            assert logged == {"synthetic_lt-train", "synthetic_lt-test"}, child.info.run_name
        # One dataset per split for the whole experiment, shared by all eight runs.
        digests = {
            (d.dataset.name, d.dataset.digest) for c in children for d in c.inputs.dataset_inputs
        }
        assert len(digests) == 2
        versions = client.search_model_versions(f"name = '{model}'")
        registering = {
            c.info.run_id for c in children if c.data.params.get("tracking.register") == model
        }
        assert sorted(int(v.version) for v in versions) == [1, 2, 3, 4]
        assert {v.run_id for v in versions} == registering and len(registering) == 4
        parents = [r.info.run_id for r in runs if r.data.tags.get("sweep") == "parent"]
        by_parent = {
            p: [c for c in children if c.data.tags["mlflow.parentRunId"] == p] for p in parents
        }
        assert sorted(len(c) for c in by_parent.values()) == [4, 4]  # each sweep's jobs its own
        for own in by_parent.values():
            assert len({c.data.tags["sampler"] for c in own} | {"uniform"}) == 2
            assert len({c.data.params["trainer.epochs"] for c in own}) == 1
        full = [c for c in children if c.data.params["trainer.epochs"] == "2"]
        assert sorted(c.info.run_name for c in full) == [
            f"{sampler}-synthetic_lt-s{seed}"
            for sampler in ("hard_mined", "uniform")
            for seed in (0, 1)
        ]
        for child in full:
            _check_full_record(client, child.info.run_id, tmp_path)
    # Artifacts went through the server into its own folder.
    assert list((server.folder / "artifacts").rglob("checkpoint.pt"))


def _check_full_record(client: MlflowClient, run_id: str, tmp_path: Path) -> None:
    """A two-epoch run's record through the server: every epoch's metrics, the final metrics,
    the figures (whole PNG files), the report and the checkpoint."""
    for key in ("train/loss", "test/balanced_accuracy", "sampling/target/class_9"):
        assert [m.step for m in client.get_metric_history(run_id, key)] == [1, 2], key
    assert "final/balanced_accuracy" in client.get_run(run_id).data.metrics
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {
        "config.yaml",
        "classification_report.txt",
        "confusion_matrix.png",
        "sampled_class_shares.png",
        "checkpoint",
    } <= artifacts
    png = client.download_artifacts(run_id, "confusion_matrix.png", str(tmp_path))
    assert Path(png).read_bytes()[:4] == b"\x89PNG"


# --- the conflict made certain: another job's insert held open ------------------------------


def held_insert(
    database: str, sql: str, values: tuple[Any, ...], meanwhile: Callable[[], Any]
) -> Any:
    """``meanwhile()`` while a real transaction holds an uncommitted insert (another job that
    created the same thing a moment earlier and has not committed yet): once the server's own
    insert of it waits on that row's lock, the transaction commits, and the server's insert
    fails its unique constraint. ``meanwhile``'s result, or what it raised, once it returns."""
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = meanwhile()
        except BaseException as error:  # handed to the test below
            outcome["error"] = error

    with (
        psycopg.connect(database) as other_job,
        psycopg.connect(database, autocommit=True) as watch,
    ):
        other_job.execute(sql, values)
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        waiting = 0
        while not waiting and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
            (waiting,) = watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ).fetchone()
        assert waiting, "the server's insert never waited on the held row"
        other_job.commit()
        thread.join(60)
    assert not thread.is_alive(), "the call did not return within 60 s of the commit"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_a_dataset_another_job_created_first_is_reused(server):
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.meta_dataset import MetaDataset

    name = f"held-{uuid.uuid4().hex[:8]}"
    tracker = Tracker.start(server.url, name, "first", params={}, tags={})
    datasets = [
        DatasetInput(
            MetaDataset(
                CodeDatasetSource({}), name=f"data-{split}", digest=f"d-{split}"
            )._to_mlflow_entity(),
            [InputTag("mlflow.data.context", split)],
        )
        for split in ("train", "test")
    ]
    theirs = uuid.uuid4().hex
    try:
        held_insert(
            server.database,
            "INSERT INTO datasets (dataset_uuid, experiment_id, name, digest, dataset_source_type,"
            " dataset_source) VALUES (%s, %s, 'data-train', 'd-train', 'code', '{}')",
            (theirs, int(tracker.experiment_id)),
            lambda: tracker.log_inputs(datasets),
        )
    finally:
        tracker.finish()
    run = MlflowClient(server.url).get_run(tracker.run_id)
    assert sorted(d.dataset.name for d in run.inputs.dataset_inputs) == ["data-test", "data-train"]
    with psycopg.connect(server.database) as connection:
        linked = connection.execute(
            "SELECT source_id FROM inputs WHERE destination_id = %s", (tracker.run_id,)
        ).fetchall()
    assert (theirs,) in linked  # the other job's dataset, not a copy of it


def test_an_experiment_another_job_created_first_is_used(server):
    name = f"held-{uuid.uuid4().hex[:8]}"
    client = MlflowClient(server.url)
    found = held_insert(
        server.database,
        "INSERT INTO experiments (name, artifact_location, lifecycle_stage, creation_time,"
        " last_update_time) VALUES (%s, 'mlflow-artifacts:/held', 'active', 0, 0)",
        (name,),
        lambda: experiment_id(client, server.url, name),
    )
    assert client.get_experiment(found).name == name
    assert client.get_experiment(found).artifact_location == "mlflow-artifacts:/held"


@pytest.mark.unit
def test_only_a_taken_name_or_key_counts_as_created_by_another_job():
    from mlflow.protos.databricks_pb2 import BAD_REQUEST, INTERNAL_ERROR, RESOURCE_ALREADY_EXISTS

    unique = '(psycopg.errors.UniqueViolation) duplicate key value violates unique constraint "dataset_pk"'
    foreign = '(psycopg.errors.ForeignKeyViolation) insert or update on table "inputs" violates foreign key constraint'
    assert already_exists(MlflowException(unique, BAD_REQUEST))
    assert already_exists(MlflowException("UNIQUE constraint failed: datasets.name", BAD_REQUEST))
    assert already_exists(
        MlflowException("Experiment(name=x) already exists.", RESOURCE_ALREADY_EXISTS)
    )
    assert not already_exists(MlflowException(foreign, BAD_REQUEST))
    assert not already_exists(MlflowException(unique, INTERNAL_ERROR))  # not what a store sends
    assert not already_exists(ConnectionError("duplicate key value violates unique constraint"))
